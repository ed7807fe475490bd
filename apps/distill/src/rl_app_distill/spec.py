"""`uv run apps/distill [--config FILE] [key=value ...] [--dry-run] [--no-ray]`

On-policy distillation. With no arguments: the CPU default (configs/cpu_default.yaml) —
`max 3 8 1 5 =` prompts generated locally into parquet, a teacher built first (a tiny model
trained briefly on the training answers), a smaller student (same tokenizer) with a short
supervised warm-up, then the student samples, the teacher scores every sampled token on its own
workers, and each token's negated reverse KL is its advantage. It prints the student's held-out
accuracy before and after with standard errors (also in output_dir/summary.json).

Teachers: `distill_app.teachers` ({name: {model, tags, kl_coef, ...}}); several are routed by
each row's tag, or averaged (rl_runtime.pipelines.distill.teachers); a teacher's tokenizer must
equal the student's (refused otherwise, naming both models)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from rl_app_distill.options import AppOptions
from rl_app_rlvr import spec as rlvr_spec
from rl_runtime.cli.app_main import AppSpec, Composed, app_main, load_app
from rl_runtime.pipelines.rlvr.metrics import summary_row
from rl_runtime.step.sft_data import SFTDataError

APP_DIR = Path(__file__).resolve().parents[2]
"""apps/distill (its configs/ folder)."""
DEFAULT_CONFIG = APP_DIR / "configs" / "cpu_default.yaml"


def compose(cfg: Any, app: Any = None, flags: frozenset[str] = frozenset()) -> Composed:
    """RLVR's composition (rl_app_rlvr.spec.compose) with the teachers' roles and plan
    (rl_app_distill.compose.compose_distill)."""
    from rl_app_distill.compose import compose_distill

    composed = rlvr_spec.compose(cfg, app, flags)
    return compose_distill(composed, cfg, app)


def run(cfg: Any, app: AppOptions, composed: Composed, flags: frozenset[str] = frozenset()) -> Any:
    """Data and student (apps/rlvr's `prepare`), the teacher (`distill_app.teacher_build`), the
    tokenizer check, then the distillation recipe on the Runner."""
    from rl_app_distill.recipe import PROGRESS_KEYS, STDOUT_KEYS, DistillRecipe
    from rl_app_distill.teacher import build_arith_teacher
    from rl_config.errors import ConfigError, ConfigIssue
    from rl_runtime.pipelines.distill.teachers import check_tokenizers
    from rl_runtime.run.options import RunOptions
    from rl_runtime.run.runner import Runner

    path = rlvr_spec.prepare(cfg, app)
    plan = composed.plan
    if app.teacher_build.out_dir is not None:
        build_arith_teacher(app.teacher_build, plan.rlvr, cfg.seed)
    try:
        check_tokenizers(path, plan.teachers.teachers)
    except ValueError as exc:
        raise ConfigError([ConfigIssue("distill_app.teachers", str(exc))]) from None
    options = RunOptions.from_app(
        app, path, stdout_keys=STDOUT_KEYS, progress_keys=PROGRESS_KEYS,
        eval_before_training=app.eval_before_training,
        derived={"prompt_length": plan.rlvr.prompt_length}, curve_panels="distill",
    )  # fmt: skip
    recipe = DistillRecipe(app, plan, path)
    try:
        return Runner(cfg, composed.components, recipe, options).run()
    finally:
        recipe.close()


SPEC = AppSpec(
    prog="apps/distill",
    description=__doc__ or "",
    default_config=DEFAULT_CONFIG,
    section=AppOptions.SECTION,
    options=AppOptions,
    compose=compose,
    run=run,
    title="student's held-out accuracy (greedy; sampled mean and pass@k; trivial baseline)",
    summary_row=summary_row,
    before_label="before distillation",
    after_label="after distillation",
    data_errors=(*rlvr_spec.data_errors(), SFTDataError),
)
load = partial(load_app, SPEC)
main = partial(app_main, SPEC)
