"""apps/rlvr's command line and run, as functions other entry points reuse (apps/async runs it
twice, tests run it in-process): compose a config, prepare the runtime inputs, run the recipe."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from rlvr_options import AppOptions

from rl_runtime.cli.app_main import AppSpec, Composed, load_app
from rl_runtime.pipelines.rlvr.metrics import summary_row

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG = HERE / "configs" / "cpu_default.yaml"


def compose(cfg: Any, app: Any = None, flags: frozenset[str] = frozenset()) -> Composed:
    """The shared components and the RLVR plan (rl_runtime.pipelines.rlvr.compose.compose_rlvr); generated
    arithmetic data no data key reads is a refusal (ArithDataOptions.unread_by)."""
    from dataclasses import replace

    from rl_envs.tasks.arith import arith_parquet_paths
    from rl_runtime.pipelines.rlvr.compose import compose_rlvr
    from rl_runtime.pipelines.rlvr.data import preflight_data

    composed = compose_rlvr(cfg)
    generated = (
        arith_parquet_paths(app.arith_data.out_dir) if app and app.arith_data.generate else ()
    )
    composed = replace(composed, data=preflight_data(composed.plan.data, generated))
    unread = app.arith_data.unread_by(composed.plan.data) if app is not None else None
    return replace(composed, refusals=(*composed.refusals, unread)) if unread else composed


def prepare(cfg: Any, app: AppOptions) -> str:
    """Runtime inputs: the arithmetic parquet files (rlvr_app.arith_data.generate) and the
    policy model (built when rlvr_app.build_tiny_model); returns the model path."""
    if app.arith_data.generate:
        app.arith_data.write()
    return app.model_path(cfg.pretrain, cfg.system_envs)


def run(cfg: Any, app: AppOptions, composed: Composed, flags: frozenset[str] = frozenset(), *,
        eval_before: bool | None = None, app_outputs: tuple[str, ...] = ()) -> Any:  # fmt: skip
    """The RLVR recipe on the Runner (Ray or in-process per `app.use_ray`); the RunResult.
    `eval_before` overrides `rlvr_app.eval_before_training`; `app_outputs`: files the caller
    writes for this run (RunOptions.app_outputs)."""
    from rlvr_pipeline import PROGRESS_KEYS, STDOUT_KEYS, RlvrRecipe

    from rl_runtime.run.runner import Runner, RunOptions

    path = prepare(cfg, app)
    options = RunOptions.from_app(
        app, path, stdout_keys=STDOUT_KEYS, progress_keys=PROGRESS_KEYS,
        eval_before_training=app.eval_before_training if eval_before is None else eval_before,
        app_outputs=app_outputs, derived={"prompt_length": composed.plan.prompt_length},
    )  # fmt: skip
    recipe = RlvrRecipe(app, composed.plan, path)
    try:
        return Runner(cfg, composed.components, recipe, options).run()
    finally:
        recipe.close()


def data_errors() -> tuple[type[BaseException], ...]:
    from rl_envs.tasks.dataset import DataError

    return (FileNotFoundError, DataError)


SPEC = AppSpec(
    prog="apps/rlvr",
    default_config=DEFAULT_CONFIG,
    section=AppOptions.SECTION,
    options=AppOptions,
    compose=compose,
    run=run,
    title="held-out accuracy (greedy; sampled mean and pass@k; trivial baseline)",
    summary_row=summary_row,
    data_errors=data_errors(),
)
load = partial(load_app, SPEC)
