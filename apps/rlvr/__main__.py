"""`uv run apps/rlvr [--config FILE] [key=value ...] [--dry-run] [--no-ray]`

With no arguments: the CPU default (configs/cpu_default.yaml) — `max 3 8 1 5 =` prompts generated
locally into parquet (held-out problems disjoint from training ones), a tiny model built locally, a short
supervised warm-up on noisy answers, then GRPO with DAPO's clip-higher, token-mean loss and
dynamic sampling; it prints held-out accuracy before and after RL with standard errors and a
trivial baseline (also written to output_dir/summary.json).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from rlvr_app import DEFAULT_CONFIG, compose_rlvr, load, run  # noqa: E402

FLAGS = {"dry-run": "print the components and exit", "no-ray": "run every worker in this process"}


def main(argv: list[str] | None = None) -> int:
    """`--config FILE key=value ...`, or ROLL's `--config_path DIR --config_name NAME key=value`."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from rl_config.cli_args import parse_app_args
    from rl_config.errors import ConfigError
    from rl_runtime.pipeline import plan_text

    try:
        args = parse_app_args(argv, flags=FLAGS, default_config=DEFAULT_CONFIG, prog="apps/rlvr")
        cfg, app = load(args.config, args.overrides)
        components, plan = compose_rlvr(cfg)
        placement = plan_text(components)  # a placement the cluster cannot make fails here
    except (ConfigError, ValueError, KeyError) as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    if "no_ray" in args.flags:
        app.use_ray = False
    unscorable = [f"{why} (rewards.{d})" for d, why in plan.rewards.unsupported.items()]
    if "dry_run" in args.flags:
        import pprint

        for line in (*cfg.config_warnings(), *components.warnings, *plan.notes, *unscorable):
            print(f"warning: {line}")
        print(placement)
        print("rlvr: " + pprint.pformat(plan, width=98, sort_dicts=False).replace("\n", "\n  "))
        return 0
    if unscorable:  # a dry run lists them; a run cannot score those rows
        print("config error: " + "; ".join(unscorable), file=sys.stderr)
        return 1
    from rl_envs.tasks.dataset import DataError
    from rl_runtime.pipeline import print_result
    from rl_runtime.rlvr_metrics import summary_row

    try:
        result = run(cfg, app, components, plan)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    except (FileNotFoundError, DataError) as exc:  # a data file the config names, bad rows
        print(f"data error: {exc}", file=sys.stderr)
        return 1
    print_result(result, "held-out accuracy (greedy; sampled mean and pass@k; trivial baseline)",
                 summary_row)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
