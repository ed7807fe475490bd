"""App-only options (the `rlvr_app:` section of a config).

The experiment itself is validated by rl_config (ROLL key names); `rlvr_app:` holds what only this
app needs: generating the CPU default's arithmetic data, building the tiny model, the supervised
warm-up (rl_runtime.rlvr_warmup.WarmupOptions), Ray vs in-process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rl_runtime.app_options import AppRunOptions
from rl_runtime.rlvr_warmup import WarmupOptions


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
    #: share of the distinct problems held out (one prompt each; rl_envs.tasks.arith.split)
    val_fraction: float = 0.2
    seed: int = 0


@dataclass
class AppOptions(AppRunOptions):
    SECTION = "rlvr_app"
    PIPELINE = "rlvr"
    arith_data: ArithDataOptions = field(default_factory=ArithDataOptions)
    warmup: WarmupOptions = field(default_factory=WarmupOptions)


__all__ = ["AppOptions", "ArithDataOptions", "WarmupOptions"]
