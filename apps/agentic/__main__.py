"""`uv run apps/agentic`: runs the rl_app_agentic package's command line (its help: rl_app_agentic.spec)."""

from rl_app_agentic.spec import main

if __name__ == "__main__":
    raise SystemExit(main())
