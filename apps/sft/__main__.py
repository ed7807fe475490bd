"""`uv run apps/sft`: runs the rl_app_sft package's command line (its help: rl_app_sft.spec)."""

from rl_app_sft.spec import main

if __name__ == "__main__":
    raise SystemExit(main())
