"""`uv run apps/agentic [--config FILE] [key=value ...] [--dry-run] [--rollout-only] [--no-ray]`

With no arguments: the CPU default (configs/cpu_default.yaml) — a tiny model built locally,
FrozenLake, a short supervised warm-up on solver demonstrations, then RL; it prints a summary table
of validation success before and after RL (also written to output_dir/summary.json).
"""

from __future__ import annotations

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

    from rl_config.loading import load_app_config

    cfg, section = load_app_config(config, overrides, section="agentic_app")
    return cfg, AppOptions.from_mapping(section)


def model_path(cfg, app) -> str:
    """The policy model: `pretrain`, built first when agentic_app.build_tiny_model is set."""
    from rl_runtime.pipeline import policy_model_path

    return policy_model_path(cfg.pretrain, app.tiny_model if app.build_tiny_model else None)


FLAGS = {
    "dry-run": "print the components and exit",
    "rollout-only": "dump trajectories to JSONL",
    "no-ray": "run every worker in this process",
}


def main(argv: list[str] | None = None) -> int:
    """`--config FILE key=value ...`, or ROLL's `--config_path DIR --config_name NAME key=value`."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from rl_config.cli_args import parse_app_args
    from rl_config.errors import ConfigError
    from rl_runtime.pipeline import compose_here, plan_text

    try:
        args = parse_app_args(argv, flags=FLAGS, default_config=DEFAULT_CONFIG, prog="apps/agentic")
        rollout_only = "rollout_only" in args.flags
        cfg, app = load(args.config, args.overrides)
        components = compose_here(cfg, rollout_only=rollout_only)
    except (ConfigError, ValueError) as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    if "no_ray" in args.flags:
        app.use_ray = False
    if "dry_run" in args.flags:
        for line in (*cfg.config_warnings(), *components.warnings):
            print(f"warning: {line}")
        print(plan_text(components))
        return 0
    from agentic_pipeline import STDOUT_KEYS, AgenticRecipe, RolloutOnlyRecipe, summary_row

    from rl_runtime.pipeline import Runner, RunOptions, print_result

    path = model_path(cfg, app)
    options = RunOptions.from_app(
        app,
        path,
        agent_mode=app.agent_loop_mode,
        eval_before_training=app.eval_before_training and not rollout_only,
        export_hf=app.export_hf and not rollout_only,
        stdout_keys=STDOUT_KEYS,
    )
    recipe = RolloutOnlyRecipe(cfg.output_dir) if rollout_only else AgenticRecipe(app, path)
    try:
        result = Runner(cfg, components, recipe, options).run()
    except ConfigError as exc:  # e.g. an optional package the config needs is missing
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    title = "validation (success_rate: sampled like training; greedy/success_rate: greedy)"
    print_result(result, title, summary_row, before_label="after warm-up = before RL")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
