"""App-only options (the `distill_app:` section of a config).

The experiment (prompts, the student's sampling and training, held-out data) is an RLVR config
validated by rl_config (ROLL key names); `distill_app:` holds the teachers
(rl_runtime.pipelines.distill.teachers: `teachers`), the CPU default's teacher
build (`teacher_build`), off-policy distillation (`off_policy`: before the on-policy steps, or
as the steps with `mode: off_policy`), and what apps/rlvr's options hold (arithmetic data, the student's tiny
model, its short supervised warm-up, Ray vs in-process).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rl_app_rlvr.options import AppOptions as RlvrAppOptions
from rl_runtime.pipelines.distill.off_policy import OffPolicyOptions
from rl_runtime.pipelines.distill.teacher_build import TeacherBuildOptions

MODES = ("on_policy", "off_policy")


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
    #: on_policy: the student samples, the teacher scores its tokens (off_policy, if any, runs
    #: before); off_policy: every step trains on `off_policy`'s rows (its `loss`: sft, or kd on
    #: the teacher's logits; rl_runtime.pipelines.distill.kd), no sampling but the evaluations'
    mode: str = "on_policy"

    def __post_init__(self) -> None:
        o = self.off_policy
        if self.mode not in MODES:
            raise ValueError(f"distill_app.mode={self.mode!r}: one of {list(MODES)}")
        if self.mode == "off_policy":
            if o.source == "none":
                raise ValueError("distill_app.off_policy.source: mode off_policy trains on its "
                                 "rows; set source data or teacher")  # fmt: skip
            if o.steps != OffPolicyOptions.steps:
                raise ValueError(f"distill_app.off_policy.steps={o.steps}: read in mode on_policy "
                                 "only; mode off_policy trains max_steps steps")  # fmt: skip
            if o.learning_rate is not None:
                raise ValueError("distill_app.off_policy.learning_rate: read in mode on_policy "
                                 "only; mode off_policy trains at actor_train's")  # fmt: skip
        elif o.loss == "kd":
            raise ValueError("distill_app.off_policy.loss=kd: token-level distillation runs as "
                             "the pipeline's steps; set distill_app.mode: off_policy")  # fmt: skip

    def built_models(self) -> tuple[str, ...]:
        out = self.teacher_build.out_dir
        return (out,) if out is not None else ()


__all__ = ["AppOptions", "OffPolicyOptions", "TeacherBuildOptions"]
