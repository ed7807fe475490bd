"""`uv run apps/sft [--config FILE] [key=value ...] [--dry-run] [--no-ray]`

With no arguments: the CPU default (configs/cpu_default.yaml) — a tiny model built locally,
generated arithmetic rows (prompt/response rows and two-turn chat rows; held-out number pairs
never in training), supervised fine-tuning on the assistant turns; it prints the held-out loss
and perplexity before and after (also in output_dir/summary.json). ROLL's SFT configs
(`sft_train`, `prompt_key`, `query_key`, `response_key`, `validation`) load as they are.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from rl_app_sft.options import AppOptions
from rl_runtime.cli.app_main import AppSpec, Composed, app_main, load_app
from rl_runtime.step.sft_data import SFTDataError

APP_DIR = Path(__file__).resolve().parents[2]
"""apps/sft (its configs/ folder)."""
DEFAULT_CONFIG = APP_DIR / "configs" / "cpu_default.yaml"


def _generated(cfg, app: AppOptions) -> tuple[str, str]:
    """The two files `sft_app.generate_arithmetic` writes (one path each, or a ValueError)."""
    train = cfg.actor_train.data_args.file_name
    held = cfg.validation.data_args.file_name if cfg.validation else None
    if not (isinstance(train, str) and isinstance(held, str)):
        raise ValueError("sft_app.generate_arithmetic needs one actor_train.data_args.file_name "
                         "and one validation.data_args.file_name to write")  # fmt: skip
    return train, held


def compose(cfg, app: AppOptions, flags: frozenset[str]) -> Composed:
    """The SFT components; the step count follows ROLL (epochs x rows // batch) when the
    training files can be counted (generated rows: `sft_app.arithmetic.train_rows`)."""
    from rl_runtime.compose.run_settings import data_files
    from rl_runtime.pipelines.sft.compose import compose_sft
    from rl_runtime.run.plan import machine_kwargs
    from rl_runtime.run.preflight import FIRST_ROWS, DataFiles
    from rl_runtime.step.sft_data import first_rows_problem, read_rows

    generated = _generated(cfg, app) if app.generate_arithmetic else None
    train_files = data_files(cfg.actor_train.data_args.file_name)
    rows = app.arithmetic.train_rows if generated else None
    if not generated and train_files and all(Path(f).is_file() for f in train_files):
        rows = sum(len(read_rows(f)[0]) for f in train_files)
    components = compose_sft(cfg, train_rows=rows, **machine_kwargs())
    plan = components.sft

    def checker(fields):
        return lambda path: first_rows_problem(path, fields, FIRST_ROWS)

    files = () if generated else plan.train_files
    held = () if generated else plan.eval_files
    data = (DataFiles("actor_train.data_args.file_name", files, checker(plan.fields)),
            DataFiles("validation.data_args.file_name", held, checker(plan.eval_fields)))  # fmt: skip
    return Composed(components, data=data)


def run(cfg, app: AppOptions, composed: Composed, flags: frozenset[str]):
    """Build what the config asks to build (tiny model, generated rows), then the SFT recipe."""
    from rl_app_sft.recipe import STDOUT_KEYS, SFTRecipe
    from rl_runtime.run.options import RunOptions
    from rl_runtime.run.runner import Runner

    path = app.model_path(cfg.pretrain, cfg.system_envs)
    if app.generate_arithmetic:
        from rl_runtime.pipelines.sft.arithmetic import write_rows

        a = app.arithmetic
        write_rows(*_generated(cfg, app), a.train_rows, a.eval_rows, a.seed)
    options = RunOptions.from_app(
        app, path, stdout_keys=STDOUT_KEYS, progress_keys=("train/loss", "val/loss"),
    )  # fmt: skip
    return Runner(cfg, composed.components, SFTRecipe(app, path), options).run()


def summary_row(metrics: dict[str, float]) -> dict[str, float | str]:
    keys = ("loss", "perplexity")
    return {k: float(metrics[f"val/{k}"]) for k in keys if f"val/{k}" in metrics}


SPEC = AppSpec(
    prog="apps/sft",
    description=__doc__ or "",
    default_config=DEFAULT_CONFIG,
    section=AppOptions.SECTION,
    options=AppOptions,
    compose=compose,
    run=run,
    title="held-out rows (loss: mean negative log-likelihood per trained token)",
    summary_row=summary_row,
    before_label="before SFT",
    after_label="after SFT",
    data_errors=(SFTDataError, FileNotFoundError),
)
load = partial(load_app, SPEC)
main = partial(app_main, SPEC)
