"""The CPU default's teacher: rl_runtime.pipelines.distill.teacher_build on RLVR's supervised
demonstrations of the training prompts (prompt tokens as the rollout renders them, the answer
in the reward's format `teacher_build.response_template`, no noise)."""

from __future__ import annotations

from typing import Any

from rl_runtime.pipelines.distill.teacher_build import TeacherBuildOptions, build_teacher


def build_arith_teacher(options: TeacherBuildOptions, plan: Any, seed: int) -> dict[str, float]:
    """Build the teacher of `plan`'s (an RlvrPlan) training prompts."""
    from rl_runtime.pipelines.rlvr.data import load_rlvr_prompts
    from rl_runtime.pipelines.rlvr.warmup import WarmupOptions, demonstrations
    from rl_runtime.step.sft_data import SFTExample

    def examples(tok: Any) -> list[SFTExample]:
        train = load_rlvr_prompts(plan, tok, seed).train
        demo = WarmupOptions(demos=len(train.rows), response_template=options.response_template)
        return [SFTExample(tuple(d.token_ids), tuple(d.response_mask))
                for d in demonstrations(train.rows, train.ids, tok, demo, seed)]  # fmt: skip

    return build_teacher(options, examples, {"train_files": list(plan.data.train_files),
                                             "seed": seed})  # fmt: skip
