"""`uv run apps/dpo [--config FILE] [key=value ...] [--dry-run] [--no-ray]`

With no arguments: the CPU default (configs/cpu_default.yaml) — a tiny model built locally,
generated arithmetic preference pairs (the correct last digit of A+1 chosen, a wrong digit
rejected; held-out numbers A never in training, though their last digits recur: a learned rule
on new numbers, see rl_runtime.pipelines.dpo.arithmetic), DPO; it prints held-out preference accuracy and
greedy-answer correctness before and after (also in output_dir/summary.json).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from rl_app_dpo.options import AppOptions
from rl_runtime.cli.app_main import AppSpec, Composed, app_main, load_app
from rl_runtime.pipelines.dpo.data import PreferenceDataError

APP_DIR = Path(__file__).resolve().parents[2]
"""apps/dpo (its configs/ folder)."""
DEFAULT_CONFIG = APP_DIR / "configs" / "cpu_default.yaml"


def compose(cfg, app: AppOptions, flags: frozenset[str]) -> Composed:
    """The preference components; `dpo_app.generate_arithmetic` needs one file to write each."""
    from rl_runtime.pipelines.dpo.compose import compose_dpo
    from rl_runtime.run.plan import machine_kwargs

    d = cfg.actor_train.data_args
    if app.generate_arithmetic and not (
        isinstance(d.file_name, str) and isinstance(d.eval_file_name, str)
    ):
        raise ValueError("dpo_app.generate_arithmetic needs one data_args.file_name and one "
                         "data_args.eval_file_name to write")  # fmt: skip
    from rl_runtime.compose.run_settings import data_files
    from rl_runtime.pipelines.dpo.data import first_rows_problem
    from rl_runtime.run.preflight import FIRST_ROWS, DataFiles

    def files(value: str | list[str] | None) -> tuple[str, ...]:  # generated: nothing to read yet
        return () if not value or app.generate_arithmetic else data_files(value)

    components = compose_dpo(cfg, **machine_kwargs())
    plan = components.preference.data

    def check(path: str) -> str | None:
        return first_rows_problem(path, plan, FIRST_ROWS)

    data = (DataFiles("actor_train.data_args.file_name", files(d.file_name), check),
            DataFiles("actor_train.data_args.eval_file_name", files(d.eval_file_name), check))  # fmt: skip
    return Composed(components, data=data)


def run(cfg, app: AppOptions, composed: Composed, flags: frozenset[str]):
    """Build what the config asks to build (tiny model, generated pairs), then the DPO recipe."""
    from rl_app_dpo.recipe import STDOUT_KEYS, DPORecipe
    from rl_runtime.run.options import RunOptions
    from rl_runtime.run.runner import Runner

    path = app.model_path(cfg.pretrain, cfg.system_envs)
    if app.generate_arithmetic:
        from rl_runtime.pipelines.dpo.arithmetic import write_pairs

        d, a = cfg.actor_train.data_args, app.arithmetic
        write_pairs(d.file_name, d.eval_file_name, a.train_rows, a.eval_rows, a.seed)
    options = RunOptions.from_app(
        app, path, stdout_keys=STDOUT_KEYS,
        progress_keys=("train/rewards/accuracies", "train/loss", "val/rewards/accuracies"),
    )  # fmt: skip
    return Runner(cfg, composed.components, DPORecipe(app, path), options).run()


def summary_row(metrics: dict[str, float]) -> dict[str, float | str]:
    keys = ("rewards/accuracies", "rewards/ties", "rewards/margins", "loss", "greedy_correct")
    return {k: float(metrics[f"val/{k}"]) for k in keys if f"val/{k}" in metrics}


SPEC = AppSpec(
    prog="apps/dpo",
    description=__doc__ or "",
    default_config=DEFAULT_CONFIG,
    section=AppOptions.SECTION,
    options=AppOptions,
    compose=compose,
    run=run,
    title="held-out pairs (rewards/accuracies: chosen reward > rejected reward, a tie counts 0.5)",
    summary_row=summary_row,
    before_label="before DPO",
    after_label="after DPO",
    data_errors=(PreferenceDataError, FileNotFoundError),
)
load = partial(load_app, SPEC)
main = partial(app_main, SPEC)
