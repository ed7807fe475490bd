"""App-only options (the `rlvr_app:` section of a config).

The experiment itself is validated by rl_config (ROLL key names); `rlvr_app:` holds what only this
app needs: generating the CPU default's arithmetic data, building the tiny model, the supervised
warm-up, Ray vs in-process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rl_runtime.app_options import TinyModelOptions, strict_options


@dataclass
class WarmupOptions:
    """Supervised warm-up on training answers before RL (0 steps = off); it uses actor_train's
    optimizer, at `learning_rate` when set."""

    steps: int = 0
    batch_size: int = 32
    #: training rows used as demonstrations at most
    demos: int = 1024
    learning_rate: float | None = None
    #: the demonstrated response; `{answer}` is the row's ground truth, `{reasoning}` (optional)
    #: the reasoning padding below
    response_template: str = "#### {answer}"
    #: probability that a demonstrated numeric answer is wrong on purpose (a noisy teacher)
    answer_noise: float = 0.0
    #: `{reasoning}` is `reasoning_word` repeated k times, k long-tailed (a discrete Pareto with
    #: shape `reasoning_tail`: P(k >= K) = (1 + K) ** -reasoning_tail), capped at
    #: `reasoning_max_words`; 0 = no padding. Teaches the policy a long-tailed response length.
    reasoning_max_words: int = 0
    reasoning_tail: float = 1.0
    reasoning_word: str = " then"  # one token of the tiny model's tokenizer

    def __post_init__(self) -> None:
        if self.reasoning_max_words < 0:
            raise ValueError(
                f"rlvr_app.warmup.reasoning_max_words={self.reasoning_max_words}: must be >= 0"
            )
        if self.reasoning_tail <= 0:
            raise ValueError(f"rlvr_app.warmup.reasoning_tail={self.reasoning_tail}: must be > 0")


@dataclass
class ArithDataOptions:
    """Task prompts written to parquet (verl's schema) before the run; held-out problems are
    disjoint from training problems (see rl_envs.tasks.arith)."""

    generate: bool = False
    out_dir: str = "./output/rlvr_data"
    #: `max` (largest of num_digits digits) or `add` (a+b)
    kind: str = "max"
    num_digits: int = 4
    max_a: int = 99
    max_b: int = 9
    val_fraction: float = 0.2
    seed: int = 0


@dataclass
class AppOptions:
    build_tiny_model: bool = False
    tiny_model: TinyModelOptions = field(default_factory=TinyModelOptions)
    arith_data: ArithDataOptions = field(default_factory=ArithDataOptions)
    warmup: WarmupOptions = field(default_factory=WarmupOptions)
    use_ray: bool = True
    num_cpus: float | None = None
    object_store_mb: int = 200
    cpu_per_bundle: float = 1.0
    export_hf: bool = False
    eval_before_training: bool = True

    @classmethod
    def from_mapping(cls, raw: dict[str, Any] | None) -> AppOptions:
        return strict_options(cls, raw, "rlvr_app")
