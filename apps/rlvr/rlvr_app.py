"""apps/rlvr's run, as functions other entry points reuse (apps/async runs it twice, tests run it
in-process): load the config, compose it, prepare the runtime inputs, run the recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG = HERE / "configs" / "cpu_default.yaml"


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
        from rl_envs.tasks.arith import write_arith_parquet

        d = app.arith_data
        write_arith_parquet(d.out_dir, kind=d.kind, num_digits=d.num_digits, max_a=d.max_a,
                            max_b=d.max_b, val_fraction=d.val_fraction, seed=d.seed)  # fmt: skip
    return policy_model_path(cfg.pretrain, app.tiny_model if app.build_tiny_model else None)


def run(cfg: Any, app: Any, components: Any, plan: Any, *, eval_before: bool | None = None) -> Any:
    """The RLVR recipe on the Runner (Ray or in-process per `app.use_ray`); the RunResult.
    `eval_before` overrides `rlvr_app.eval_before_training`."""
    from rlvr_pipeline import STDOUT_KEYS, RlvrRecipe

    from rl_runtime.pipeline import Runner, RunOptions

    path = prepare(cfg, app)
    options = RunOptions.from_app(
        app,
        path,
        eval_before_training=app.eval_before_training if eval_before is None else eval_before,
        stdout_keys=STDOUT_KEYS,
        progress_keys=(
            "reward/accuracy",
            "reward/mean",
            "val/accuracy",
            "dynamic_sampling/dropped_groups",
            "async/lag_mean",
        ),
    )
    recipe = RlvrRecipe(app, plan, path)
    try:
        return Runner(cfg, components, recipe, options).run()
    finally:
        recipe.close()
