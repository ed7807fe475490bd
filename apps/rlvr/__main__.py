"""`uv run apps/rlvr`: runs the rl_app_rlvr package's command line (its help: rl_app_rlvr.spec)."""

from rl_app_rlvr.spec import main

if __name__ == "__main__":
    raise SystemExit(main())
