"""App-only options (the `dpo_app:` section of a config): the tiny model, the generated arithmetic
preference data of the CPU default, Ray vs in-process, the greedy-answer check."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rl_runtime.app_options import TinyModelOptions, strict_options


@dataclass
class ArithmeticOptions:
    """Generated pairs: 'What is the last digit of A+B?' -> correct digit vs a wrong one."""

    train_rows: int = 2000
    eval_rows: int = 200
    seed: int = 0


@dataclass
class AppOptions:
    build_tiny_model: bool = False
    tiny_model: TinyModelOptions = field(default_factory=TinyModelOptions)
    #: write the arithmetic pairs to actor_train.data_args.file_name / eval_file_name first
    generate_arithmetic: bool = False
    arithmetic: ArithmeticOptions = field(default_factory=ArithmeticOptions)
    #: held-out prompts answered greedily at each evaluation (rows need an `answer`); 0 = off
    greedy_eval_prompts: int = 0
    use_ray: bool = True
    num_cpus: float | None = None
    object_store_mb: int = 200
    cpu_per_bundle: float = 1.0
    export_hf: bool = False
    eval_before_training: bool = True

    @classmethod
    def from_mapping(cls, raw: dict[str, Any] | None) -> AppOptions:
        return strict_options(cls, raw, "dpo_app")
