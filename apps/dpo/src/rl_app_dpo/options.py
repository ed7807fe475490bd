"""App-only options (the `dpo_app:` section of a config): the tiny model, the generated arithmetic
preference data of the CPU default, Ray vs in-process, the greedy-answer check."""

from __future__ import annotations

from dataclasses import dataclass, field

from rl_runtime.cli.app_options import AppRunOptions


@dataclass
class ArithmeticOptions:
    """Generated pairs: 'What is the last digit of A+B?' -> correct digit vs a wrong one."""

    train_rows: int = 2000
    eval_rows: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("train_rows", "eval_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"dpo_app.arithmetic.{name}={getattr(self, name)}: must be >= 1")


@dataclass
class AppOptions(AppRunOptions):
    SECTION = "dpo_app"
    PIPELINE = "dpo"
    #: the trained policy as an HF model directory at the end (output_dir/hf_model; `rl-export`)
    export_hf: bool = True
    #: write the arithmetic pairs to actor_train.data_args.file_name / eval_file_name first
    generate_arithmetic: bool = False
    arithmetic: ArithmeticOptions = field(default_factory=ArithmeticOptions)
    #: held-out prompts answered greedily at each evaluation (rows need an `answer`); 0 = off
    greedy_eval_prompts: int = 0

    def __post_init__(self) -> None:
        if self.greedy_eval_prompts < 0:  # a slice [:-1] would answer all prompts but the last
            raise ValueError(
                f"dpo_app.greedy_eval_prompts={self.greedy_eval_prompts}: must be >= 0 (0 = off)"
            )
