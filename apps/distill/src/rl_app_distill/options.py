"""App-only options (the `distill_app:` section of a config).

The experiment (prompts, the student's sampling and training, held-out data) is an RLVR config
validated by rl_config (ROLL key names); `distill_app:` holds the teachers
(rl_runtime.pipelines.distill.teachers: `teachers`), the CPU default's teacher
build (`teacher_build`), off-policy distillation before the on-policy steps (`off_policy`), and what apps/rlvr's options hold (arithmetic data, the student's tiny
model, its short supervised warm-up, Ray vs in-process).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rl_app_rlvr.options import AppOptions as RlvrAppOptions
from rl_runtime.pipelines.distill.off_policy import OffPolicyOptions
from rl_runtime.pipelines.distill.teacher_build import TeacherBuildOptions


@dataclass
class AppOptions(RlvrAppOptions):
    SECTION = "distill_app"
    PIPELINE = "rlvr"  # the experiment's keys are RLVR's (what a resume checks)
    #: {name: {model, tags, kl_coef, dtype, device_mapping, infer_batch_size}}
    #: (rl_runtime.pipelines.distill.teachers)
    teachers: dict[str, Any] = field(default_factory=dict)
    teacher_build: TeacherBuildOptions = field(default_factory=TeacherBuildOptions)
    #: off-policy distillation before the on-policy steps: SFT on given data or on the
    #: teacher's samples (rl_runtime.pipelines.distill.off_policy); replaces `warmup`
    off_policy: OffPolicyOptions = field(default_factory=OffPolicyOptions)

    def built_models(self) -> tuple[str, ...]:
        out = self.teacher_build.out_dir
        return (out,) if out is not None else ()


__all__ = ["AppOptions", "OffPolicyOptions", "TeacherBuildOptions"]
