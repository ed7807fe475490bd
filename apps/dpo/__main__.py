"""`uv run apps/dpo [--config FILE] [key=value ...] [--dry-run] [--no-ray]`

With no arguments: the CPU default (configs/cpu_default.yaml) — a tiny model built locally,
generated arithmetic preference pairs (the correct last digit of A+B chosen, a wrong digit
rejected; held-out prompts disjoint by content), DPO; it prints held-out preference accuracy and
greedy-answer correctness before and after (also in output_dir/summary.json).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

DEFAULT_CONFIG = HERE / "configs" / "cpu_default.yaml"
FLAGS = {"dry-run": "print the components and exit", "no-ray": "run every worker in this process"}


def load(config: Path, overrides: list[str]):
    """Compose + validate the experiment; split off the app's own `dpo_app:` section."""
    from dpo_options import AppOptions

    from rl_config.loading import load_app_config

    cfg, section = load_app_config(config, overrides, section="dpo_app")
    return cfg, AppOptions.from_mapping(section)


def prepare(cfg, app) -> str:
    """Build what the config asks to build (tiny model, generated pairs); the policy model path."""
    from rl_runtime.pipeline import policy_model_path

    path = policy_model_path(cfg.pretrain, app.tiny_model if app.build_tiny_model else None)
    if app.generate_arithmetic:
        from rl_runtime.dpo_arithmetic import write_pairs

        d = cfg.actor_train.data_args
        if not isinstance(d.file_name, str) or not isinstance(d.eval_file_name, str):
            raise ValueError("dpo_app.generate_arithmetic needs one data_args.file_name and one "
                             "data_args.eval_file_name to write")  # fmt: skip
        a = app.arithmetic
        write_pairs(d.file_name, d.eval_file_name, a.train_rows, a.eval_rows, a.seed)
    return path


def main(argv: list[str] | None = None) -> int:
    """`--config FILE key=value ...`, or ROLL's `--config_path DIR --config_name NAME key=value`."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import importlib.util

    from rl_config.cli_args import parse_app_args
    from rl_config.errors import ConfigError
    from rl_runtime.compose.dpo import compose_dpo
    from rl_runtime.pipeline import plan_text
    from rl_sync.device import detect_device_kind

    try:
        args = parse_app_args(argv, flags=FLAGS, default_config=DEFAULT_CONFIG, prog="apps/dpo")
        cfg, app = load(args.config, args.overrides)
        components = compose_dpo(
            cfg,
            device_kind=detect_device_kind(),
            flash_attn_available=importlib.util.find_spec("flash_attn") is not None,
        )
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
    from dpo_pipeline import STDOUT_KEYS, DPORecipe, summary_row

    from rl_runtime.pipeline import Runner, RunOptions, print_result
    from rl_runtime.preference_data import PreferenceDataError

    try:
        path = prepare(cfg, app)
    except ValueError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    options = RunOptions.from_app(
        app,
        path,
        stdout_keys=STDOUT_KEYS,
        progress_keys=("train/rewards/accuracies", "train/loss", "val/rewards/accuracies"),
    )
    try:
        result = Runner(cfg, components, DPORecipe(app, path), options).run()
    except (ConfigError, PreferenceDataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    title = "held-out pairs (rewards/accuracies: chosen reward > rejected reward)"
    print_result(result, title, summary_row, before_label="before DPO", after_label="after DPO")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
