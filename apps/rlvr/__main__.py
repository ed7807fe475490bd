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

DEFAULT_CONFIG = HERE / "configs" / "cpu_default.yaml"
FLAGS = {"dry-run": "print the components and exit", "no-ray": "run every worker in this process"}


def load(config: Path, overrides: list[str]):
    """Compose + validate the experiment; split off the app's own `rlvr_app:` section."""
    from rlvr_options import AppOptions

    from rl_config.loading import load_app_config

    cfg, section = load_app_config(config, overrides, section="rlvr_app")
    return cfg, AppOptions.from_mapping(section)


def compose_rlvr(cfg):
    """The shared components (compose(pipeline="rlvr")) and the RLVR plan."""
    import importlib.util

    from rl_runtime.compose import compose
    from rl_runtime.compose.rlvr import build_rlvr
    from rl_sync.device import detect_device_kind

    components = compose(
        cfg,
        device_kind=detect_device_kind(),
        flash_attn_available=importlib.util.find_spec("flash_attn") is not None,
        pipeline="rlvr",
    )
    return components, build_rlvr(cfg)


def prepare(cfg, app) -> str:
    """Runtime inputs: the arithmetic parquet files (rlvr_app.arith_data.generate) and the
    policy model (built when rlvr_app.build_tiny_model); returns the model path."""
    from rl_runtime.pipeline import policy_model_path

    if app.arith_data.generate:
        from arith_task import write_arith_parquet

        d = app.arith_data
        write_arith_parquet(d.out_dir, kind=d.kind, num_digits=d.num_digits, max_a=d.max_a,
                            max_b=d.max_b, val_fraction=d.val_fraction, seed=d.seed)  # fmt: skip
    return policy_model_path(cfg.pretrain, app.tiny_model if app.build_tiny_model else None)


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
    from rlvr_metrics import summary_row
    from rlvr_pipeline import STDOUT_KEYS, RlvrRecipe

    from rl_envs.tasks.dataset import DataError
    from rl_runtime.pipeline import Runner, RunOptions, print_result

    path = prepare(cfg, app)
    options = RunOptions(
        model_path=path,
        use_ray=app.use_ray,
        num_cpus=app.num_cpus,
        object_store_mb=app.object_store_mb,
        cpu_per_bundle=app.cpu_per_bundle,
        eval_before_training=app.eval_before_training,
        export_hf=app.export_hf,
        stdout_keys=STDOUT_KEYS,
        progress_keys=(
            "reward/accuracy",
            "reward/mean",
            "val/accuracy",
            "dynamic_sampling/dropped_groups",
        ),
    )
    recipe = RlvrRecipe(app, plan, path)
    try:
        result = Runner(cfg, components, recipe, options).run()
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    except (FileNotFoundError, DataError) as exc:  # a data file the config names, bad rows
        print(f"data error: {exc}", file=sys.stderr)
        return 1
    finally:
        recipe.close()
    print_result(result, "held-out accuracy (greedy; sampled mean and pass@k; trivial baseline)",
                 summary_row)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
