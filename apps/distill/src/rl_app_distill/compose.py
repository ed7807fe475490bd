"""Distillation's part of the composition: RLVR's (prompts, sampling, held-out accuracy,
rewards as the accuracy metric) plus the teachers, each a role of its own.

On-policy distillation trains on every sampled group, so RLVR's keys that drop or reweight
groups by reward are refusals here: `dynamic_sampling.enable`, `difficulty_mask`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rl_runtime.cli.app_main import Composed
from rl_runtime.pipelines.distill.teachers import TeachersPlan, build_teachers, teacher_role
from rl_runtime.pipelines.rlvr.compose import RlvrPlan


@dataclass(frozen=True)
class DistillPlan:
    rlvr: RlvrPlan
    teachers: TeachersPlan


def compose_distill(composed: Composed, cfg: Any, app: Any) -> Composed:
    """`composed` (RLVR's, rl_runtime.pipelines.rlvr.compose.compose_rlvr) with the teachers'
    roles and a `DistillPlan`; ValueError naming the teacher key at fault."""
    import pprint

    plan = DistillPlan(
        composed.plan,
        build_teachers(
            app.teachers if app is not None else {}, tuple(cfg.reference.device_mapping or [0])
        ),
    )
    roles = (*composed.components.roles, *(teacher_role(t, cfg) for t in plan.teachers.teachers))
    components = dataclasses.replace(composed.components, roles=roles)
    refusals = list(composed.refusals)
    if plan.rlvr.dynamic_sampling.enable:
        refusals.append(
            "dynamic_sampling.enable: drops groups whose rewards are all equal; distillation "
            "learns from the teacher on every sampled group (set it false)"
        )
    if plan.rlvr.difficulty is not None:
        refusals.append(
            "difficulty_mask: masks groups by their mean reward; distillation learns from the "
            "teacher on every sampled group (set it false)"
        )
    off = app.off_policy if app is not None else None
    if (
        off is not None
        and app.mode == "off_policy"
        and off.loss == "kd"
        and len(plan.teachers.teachers) != 1
    ):
        refusals.append(
            f"distill_app.teachers: off_policy.loss=kd distils one teacher's distribution; "
            f"{len(plan.teachers.teachers)} are configured"
        )
    details = (
        composed.details
        + "\nteachers: "
        + pprint.pformat(plan.teachers, width=98, sort_dicts=False).replace("\n", "\n  ")
    )
    if off is not None and app.mode == "off_policy":
        details += f"\nmode: off_policy (each step: {off.batch_size} rows, loss {off.loss})\n"
        details += "off_policy: " + pprint.pformat(off, width=98).replace("\n", "\n  ")
    return dataclasses.replace(composed, components=components, plan=plan, details=details,
                               refusals=tuple(refusals))  # fmt: skip
