"""`uv run apps/async`: runs the rl_app_async package's command line (its help: rl_app_async.spec)."""

from rl_app_async.spec import main

if __name__ == "__main__":
    raise SystemExit(main())
