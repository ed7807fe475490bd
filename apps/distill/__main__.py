"""`uv run apps/distill`: runs the rl_app_distill package's command line (its help: rl_app_distill.spec)."""

from rl_app_distill.spec import main

if __name__ == "__main__":
    raise SystemExit(main())
