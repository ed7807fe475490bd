"""`uv run apps/dpo`: runs the rl_app_dpo package's command line (its help: rl_app_dpo.spec)."""

from rl_app_dpo.spec import main

if __name__ == "__main__":
    raise SystemExit(main())
