"""The learning half of an on-policy distillation step: the student's sampled groups in, the
student trained toward its teacher(s) and synced out.

    student log-probs   actor_train forward of the sampled tokens (the PPO ratio's old policy)
    teacher log-probs   each teacher's role (`teacher_<name>`) scores the rows it teaches; a
                        row taught by several learns from each with its kl_coef
                        (rl_algos.distill.combine_teachers)
    advantages          per token: -kl_coef * (student - teacher), its own reverse KL negated
                        (no discount, no baseline: ROLL's, verl's and NeMo-RL's on-policy
                        distillation)
    train / sync        actor_train's configured policy loss, then the weights to the engines

Rewards are not trained on; they are the step's accuracy metric (`reward/*`).
"""

from __future__ import annotations

from typing import Any

import torch

from rl_algos.distill import combine_teachers, distill_advantages
from rl_runtime.pipelines.distill.teachers import TeachersPlan
from rl_runtime.run.context import Context
from rl_runtime.step.collate import CollatedBatch
from rl_runtime.step.policy_update import prefixed


def teacher_log_probs(
    ctx: Context, batch: CollatedBatch, plan: TeachersPlan
) -> tuple[torch.Tensor, torch.Tensor]:
    """`([B, T] teacher log-probs, [B] kl coefficient per row)`: each teacher scores only the
    rows it teaches (`TeachersPlan.coefs`), then rl_algos.distill.combine_teachers."""
    t = batch.tensors
    coefs = plan.coefs(batch.tags)
    scored = torch.zeros((len(plan.teachers), *t["input_ids"].shape))
    for k, tp in enumerate(plan.teachers):
        rows = (coefs[k] > 0).nonzero().flatten()
        if rows.numel() == len(batch.tags):
            scored[k] = ctx.forward(tp.role, t)["log_probs"].float()
        elif rows.numel():
            part = ctx.forward(tp.role, {name: v[rows] for name, v in t.items()})["log_probs"]
            scored[k, rows] = part.float()
    return combine_teachers(scored, coefs)


def distill_on_batch(ctx: Context, batch: CollatedBatch, plan: TeachersPlan) -> dict[str, float]:
    """Train the student on `batch` toward its teachers and sync the weights; `distill/*`
    (reverse KL per token, teacher and student log-prob means), `train/*`, `sync/*`."""
    timer, cluster = ctx.timer, ctx.cluster
    t = dict(batch.tensors)
    cluster.enter_phase("train")
    mask = t["response_mask"]
    with timer.phase("student_log_probs"):
        t["old_log_probs"] = ctx.forward("actor_train", t)["log_probs"]
    with timer.phase("teacher_log_probs"):
        teacher, coef = teacher_log_probs(ctx, batch, plan)
    adv = distill_advantages(t["old_log_probs"].float(), teacher.float(), mask, coef)
    t["advantages"] = t["returns"] = adv
    n = mask.sum().clamp(min=1)
    kl = (t["old_log_probs"].float() - teacher.float()) * mask
    metrics = {
        "distill/reverse_kl": float(kl.sum() / n),
        "distill/teacher_log_prob": float((teacher * mask).sum() / n),
        "distill/student_log_prob": float((t["old_log_probs"] * mask).sum() / n),
    }
    with timer.phase("actor_train"):
        metrics.update(prefixed(ctx.train("actor_train", t), "train/"))
    with timer.phase("sync"):
        metrics.update(ctx.sync_weights())
    return metrics


def learn_distill(
    ctx: Context, batch: Any, plan: TeachersPlan, *, pad_token_id: int
) -> dict[str, float]:
    """The learn step on a `RolloutBatch` of sampled groups: the rollout's metrics, samples whose
    reward call failed screened out (rl_runtime.step.failures), collate, `distill_on_batch`, the
    trajectories' `rollout_metrics`, the step's timings."""
    from rl_runtime.step.collate import collate_trajectories
    from rl_runtime.step.failures import screen_failures
    from rl_runtime.step.metrics import rollout_metrics

    metrics = dict(batch.metrics)
    if not batch.trajectories:
        metrics["train/skipped"] = 1.0
        metrics.update(ctx.timer.metrics())
        return metrics
    screened = screen_failures(batch.trajectories, ctx.components.max_failed_fraction)
    metrics.update(screened.metrics)
    collated = collate_trajectories(screened.kept, pad_token_id=pad_token_id)
    metrics.update(distill_on_batch(ctx, collated, plan))
    metrics.update(rollout_metrics(screened.kept, collated))
    metrics.update(ctx.timer.metrics())
    return metrics
