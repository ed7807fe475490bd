"""App-only options (the `rlvr_app:` section of a config).

The experiment itself is validated by rl_config (ROLL key names); `rlvr_app:` holds what only this
app needs: generating the CPU default's arithmetic data, building the tiny model, the supervised
warm-up (rl_runtime.pipelines.rlvr.warmup.WarmupOptions), Ray vs in-process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rl_runtime.cli.app_options import AppRunOptions
from rl_runtime.pipelines.rlvr.data import ArithDataOptions
from rl_runtime.pipelines.rlvr.warmup import WarmupOptions


@dataclass
class AppOptions(AppRunOptions):
    SECTION = "rlvr_app"
    PIPELINE = "rlvr"
    #: the trained policy as an HF model directory at the end (output_dir/hf_model; `rl-export`)
    export_hf: bool = True
    arith_data: ArithDataOptions = field(default_factory=ArithDataOptions)
    warmup: WarmupOptions = field(default_factory=WarmupOptions)


__all__ = ["AppOptions", "ArithDataOptions", "WarmupOptions"]
