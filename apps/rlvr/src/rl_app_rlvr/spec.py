"""`uv run apps/rlvr [--config FILE] [key=value ...] [--dry-run] [--no-ray]`

With no arguments: the CPU default (configs/cpu_default.yaml) — `47+38=` prompts (two-digit sums)
generated locally into parquet (held-out problems disjoint from training ones), a tiny model built
locally, a supervised warm-up on a teacher who often forgets to carry, then GRPO with DAPO's
clip-higher, token-mean loss and dynamic sampling; it prints held-out accuracy (greedy, sampled,
pass@k) before and after RL with standard errors, RL's gains and a trivial baseline (also written
to output_dir/summary.json).
ROLL's launcher form `--config_path DIR --config_name NAME key=value` works too.

As functions other entry points reuse (apps/async runs them twice, tests in-process): compose a
config, prepare the runtime inputs, run the recipe (rl_app_rlvr.recipe)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from rl_app_rlvr.options import AppOptions
from rl_runtime.cli.app_main import AppSpec, Composed, app_main, load_app
from rl_runtime.pipelines.rlvr.metrics import summary_row

APP_DIR = Path(__file__).resolve().parents[2]
"""apps/rlvr (its configs/ folder)."""
DEFAULT_CONFIG = APP_DIR / "configs" / "cpu_default.yaml"


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
    from rl_app_rlvr.recipe import PROGRESS_KEYS, STDOUT_KEYS, RlvrRecipe
    from rl_runtime.run.options import RunOptions
    from rl_runtime.run.runner import Runner

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
    description=__doc__ or "",
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
main = partial(app_main, SPEC)
