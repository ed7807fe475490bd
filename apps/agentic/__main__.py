"""`uv run apps/agentic [--config FILE] [key=value ...] [--dry-run] [--rollout-only] [--no-ray]`

With no arguments: the CPU default (configs/cpu_default.yaml) — a tiny model built locally,
FrozenLake, a short supervised warm-up on solver demonstrations, then RL; it prints a summary table
of validation success before and after RL.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

DEFAULT_CONFIG = HERE / "configs" / "cpu_default.yaml"


def load(config: Path, overrides: list[str]):
    """Compose + validate the experiment; split off the app's own `agentic_app:` section."""
    from agentic_options import AppOptions

    from rl_config.loading import compose_config
    from rl_config.schema import ExperimentConfig

    composed = compose_config(config, overrides)
    data = dict(composed.data)
    app = AppOptions.from_mapping(data.pop("agentic_app", None))
    cfg = ExperimentConfig.model_validate(data)
    return cfg, app


def dry_run(cfg, app) -> str:
    from agentic_options import describe_plan

    from rl_runtime.placement import plan_placement
    from rl_sync.device import detect_device_kind, ray_resource_name

    kind = detect_device_kind()
    maps = {role: w.device_mapping or [0] for role, w in cfg.workers().items()}
    if not cfg.enable_reference:
        maps.pop("reference", None)
    plan = plan_placement(
        maps,
        num_devices=cfg.total_devices,
        device_kind=kind,
        resource_name=ray_resource_name(kind),
        devices_per_worker={r: w.num_gpus_per_worker for r, w in cfg.workers().items()},
    )
    return describe_plan(cfg, app, plan.describe())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="apps/agentic", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="experiment YAML")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    parser.add_argument("--rollout-only", action="store_true", help="dump trajectories to JSONL")
    parser.add_argument("--no-ray", action="store_true", help="run every worker in this process")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from rl_config.errors import ConfigError

    try:
        cfg, app = load(args.config, args.overrides)
    except (ConfigError, ValueError) as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    if args.no_ray:
        app.use_ray = False
    if args.dry_run:
        print(dry_run(cfg, app))
        return 0
    from agentic_pipeline import AgenticPipeline
    from rich.console import Console

    from rl_runtime.timing import summary_table

    result = AgenticPipeline(cfg, app, rollout_only=args.rollout_only).run()
    console = Console()
    if result.get("summary"):
        title = "validation (success_rate: sampled like training; greedy/success_rate: greedy)"
        console.print(summary_table(title, result["summary"]))
    console.print(
        f"steps={result.get('step')} weight_version={result.get('weight_version')} "
        f"wall={result.get('wall_seconds', 0):.0f}s curves={result.get('curves')} "
        f"hf_model={result.get('hf_model')}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
