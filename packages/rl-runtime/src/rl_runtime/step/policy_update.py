"""The learning half of an RL step, shared by the recipes: a collated batch in, trained and
synced weights out.

    old log-probs  actor_train forward, only for a reward KL penalty or an estimator that reads
                   them with sum_pi_squared (optimal_token_baseline; otherwise the trainer
                   takes its own: the detached log-probs of its training forward for the
                   first optimizer step, a no-grad forward of its own for the rest; rl_train.core)
    ref log-probs  the reference role, when there is one (or actor_train with its LoRA adapter
                   disabled, when the reference is its base model)
    values         the critic, when there is one
    advantages     rl_runtime.step.advantages (reward normalisation and reward_clip, reward KL, the
                   estimator)
    train          critic, then actor_train (the configured policy loss)
    sync           the trainer's weights into the engines, the next weight version
"""

from __future__ import annotations

from typing import Any

import torch

from rl_runtime.run.context import Context
from rl_runtime.step.advantages import compute_advantages, reward_kl_coef, update_kl_controller
from rl_runtime.step.collate import CollatedBatch
from rl_train.faults import fault_active


def update_policy(ctx: Context, batch: CollatedBatch, kl_controller: Any) -> dict[str, float]:
    """Train on ``batch`` and sync the weights; the step's ``train/*``, ``critic/*``, ``kl/*``
    and ``sync/*`` metrics. The batch's ``baseline_rewards [B]`` (greedy-rollout rewards, when
    the rollout ran them) are the baseline of the estimators that need one (remax)."""
    c, timer, cluster = ctx.components, ctx.timer, ctx.cluster
    t = dict(batch.tensors)
    cluster.enter_phase("train")
    kl_coef = reward_kl_coef(c.kl, kl_controller)
    if kl_coef > 0 or "sum_pi_squared" in c.advantage.needs:
        with timer.phase("old_log_probs"):
            old = ctx.forward("actor_train", t)
            t["old_log_probs"] = old["log_probs"]
            if "sum_pi_squared" in old:
                t["sum_pi_squared"] = old["sum_pi_squared"]
    if ctx.has_reference():
        with timer.phase("ref_log_probs"):
            t["ref_log_probs"] = ctx.forward("reference", t)["log_probs"]
    if cluster.has("critic"):
        with timer.phase("values"):
            t["values"] = ctx.forward("critic", t)["values"]
    with timer.phase("advantages"):
        adv = compute_advantages(
            batch,
            c.advantage,
            values=t.get("values"),
            log_probs=t.get("old_log_probs"),
            ref_log_probs=t.get("ref_log_probs"),
            kl_coef=kl_coef,
            baseline_scores=t.get("baseline_rewards"),
            sum_pi_squared=t.get("sum_pi_squared"),
        )
        t["advantages"], t["returns"] = adv["advantages"], adv["returns"]
    if fault_active("step.nan_advantage", ctx.step + 1):  # test fault: a NaN reaches the loss
        t["advantages"] = poisoned_advantages(t["advantages"], t["response_mask"])
    metrics = update_kl_controller(kl_controller, adv, t["response_mask"])
    if "reward_clip_frac" in adv:  # ROLL logs it as critic/reward_clip_frac
        metrics["train/reward_clip_frac"] = float(adv["reward_clip_frac"])
    if cluster.has("critic"):
        with timer.phase("critic_train"):
            metrics.update(prefixed(ctx.train("critic", t), "critic/"))
    with timer.phase("actor_train"):
        metrics.update(prefixed(ctx.train("actor_train", t), "train/"))
    with timer.phase("sync"):
        metrics.update(ctx.sync_weights())
    mask = t["response_mask"]
    metrics["train/advantage_mean"] = float(adv["advantages"].sum() / mask.sum().clamp(min=1))
    return metrics


def learn_on_groups(
    ctx: Context, batch: Any, kl_controller: Any, *, pad_token_id: int
) -> dict[str, float]:
    """RLVR's learn step on a `RolloutBatch` of scored groups: the rollout's metrics, then, unless
    every group was dropped (`train/skipped`), samples whose reward call failed screened out
    (rl_runtime.step.failures: `failures/*`, a stop past `max_failed_fraction`), collate,
    `update_policy` (train and weight sync) and the trajectories' `rollout_metrics`; the step's
    timings last."""
    from rl_runtime.step.collate import collate_trajectories
    from rl_runtime.step.failures import screen_failures
    from rl_runtime.step.metrics import rollout_metrics

    metrics = dict(batch.metrics)
    if not batch.trajectories:  # every group dropped within the bound: nothing to learn from
        metrics["train/skipped"] = 1.0
        metrics.update(ctx.timer.metrics())
        return metrics
    screened = screen_failures(batch.trajectories, ctx.components.max_failed_fraction)
    metrics.update(screened.metrics)
    collated = collate_trajectories(screened.kept, pad_token_id=pad_token_id)
    metrics.update(update_policy(ctx, collated, kl_controller))
    metrics.update(rollout_metrics(screened.kept, collated))
    metrics.update(ctx.timer.metrics())
    return metrics


def poisoned_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`advantages` `[B, T]` with a NaN at the first response token of row 0 (test fault
    `step.nan_advantage@N`, rl_train.faults: pipeline step N trains on it)."""
    out = advantages.clone()
    cols = mask[0].nonzero()
    out[0, int(cols[0]) if len(cols) else 0] = float("nan")
    return out


def prefixed(metrics: dict[str, Any], prefix: str) -> dict[str, float]:
    """A worker's numeric metrics under ``prefix`` (``actor/pg_loss`` -> ``train/pg_loss``)."""
    return {
        (k if k.startswith(prefix) else prefix + k.split("/")[-1]): float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float)
    }
