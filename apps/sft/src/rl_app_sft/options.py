"""App-only options (the `sft_app:` section of a config): the tiny model, the generated
arithmetic rows of the CPU default, Ray vs in-process, the export."""

from __future__ import annotations

from dataclasses import dataclass, field

from rl_runtime.cli.app_options import AppRunOptions


@dataclass
class ArithmeticOptions:
    """Generated rows (rl_runtime.pipelines.sft.arithmetic): 'add A and B' -> 'A + B = C'."""

    train_rows: int = 2000
    eval_rows: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("train_rows", "eval_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"sft_app.arithmetic.{name}={getattr(self, name)}: must be >= 1")
        if self.train_rows + self.eval_rows > 10_000:
            raise ValueError("sft_app.arithmetic: train_rows + eval_rows must be <= 10000")


@dataclass
class AppOptions(AppRunOptions):
    SECTION = "sft_app"
    PIPELINE = "sft"
    #: the trained policy as an HF model directory at the end (output_dir/hf_model; `rl-export`)
    export_hf: bool = True
    #: write the arithmetic rows to actor_train.data_args.file_name and
    #: validation.data_args.file_name first
    generate_arithmetic: bool = False
    arithmetic: ArithmeticOptions = field(default_factory=ArithmeticOptions)
