"""Asynchronous training: the runner's step when `components.asynchronous` is set.

The recipe splits its step in two (`rollout(ctx, index) -> RolloutBatch`, run by a
`RolloutProducer` thread that only generates, and `learn(ctx, batch) -> metrics`, which collates,
trains and syncs the weights); synchronous training is `learn(ctx, rollout(ctx, step))`.
`AsyncTraining.step(ctx)` takes the next batch from the `SampleQueue`, drops the groups older than
`max_staleness` versions (`rl_runtime.asynchrony.staleness`), learns on the rest and opens the producer's
gate for the batch `max_staleness` steps ahead. `learn` reports the samples it trained on
(`rollout/num_trajectories`: failed episodes screened out), which `async/trained_samples_total`
adds up. A checkpoint holds the trainer version and the
queue's version bookkeeping (`state()`): the index of the first batch not consumed, the rollout
state before it, the lag totals. Queued samples are not saved: after a resume rollout draws them
again under the restored weights, so staleness stays within its bound (AReaL #1388).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from rl_config.rules import ASYNC_COLOCATION
from rl_runtime.asynchrony.producer import RolloutProducer
from rl_runtime.asynchrony.queue import SampleQueue
from rl_runtime.asynchrony.staleness import LagStats, filter_stale
from rl_runtime.compose.async_plan import AsyncPlan
from rl_runtime.run.recipe import Recipe, splits_step
from rl_runtime.step.metrics import SKIPPED_KEY, TRAINED_SAMPLES_KEY

STATE_KEY = "async"


class AsyncTraining:
    """Owns the queue and the producer of one run (created in the runner's setup, stopped in its
    teardown)."""

    def __init__(
        self,
        plan: AsyncPlan,
        recipe: Recipe,
        ctx: Any,
        *,
        samples_per_batch: int,
        start_index: int,
        stop_index: int,
    ) -> None:
        if not splits_step(recipe):
            raise TypeError(
                f"{type(recipe).__name__} has no `rollout` and `learn`: asynchronous training "
                "needs a recipe whose step is split into rollout(ctx, index) and learn(ctx, batch)"
            )
        colocated = ctx.cluster.colocated_with_infer()
        if colocated:
            raise RuntimeError(f"{colocated} share devices with actor_infer: {ASYNC_COLOCATION}")
        self.plan = plan
        self.recipe = recipe
        self.queue = SampleQueue(plan.queue_samples)
        self.lags = LagStats(plan.max_staleness)
        self.producer = RolloutProducer(
            lambda index: recipe.rollout(ctx, index),
            self.queue,
            max_staleness=plan.max_staleness,
            samples_per_batch=samples_per_batch,
            start_index=start_index,
            stop_index=stop_index,
            timeout_s=plan.wait_timeout_s,
            rollout_state=recipe.rollout_state,
        )

    def start(self) -> None:
        self.producer.start()

    def step(self, ctx: Any) -> dict[str, float]:
        """One training step on the next queued batch (ctx.step is its index)."""
        t0 = time.perf_counter()
        batch = self.queue.take(self.plan.wait_timeout_s, f"rollout batch {ctx.step}")
        waited = time.perf_counter() - t0
        if batch.index != ctx.step:
            raise RuntimeError(f"the trainer at step {ctx.step} got rollout batch {batch.index}")
        kept = filter_stale(batch.trajectories, ctx.weight_version, self.plan.max_staleness)
        metrics: dict[str, float] = {}
        trained = 0  # what reached train_step: learn screens failed samples out of `kept`
        if kept.kept:
            metrics.update(
                self.recipe.learn(ctx, dataclasses.replace(batch, trajectories=kept.kept))
            )
            if TRAINED_SAMPLES_KEY not in metrics and not metrics.get(SKIPPED_KEY):
                raise RuntimeError(
                    f"{type(self.recipe).__name__}.learn reported neither {TRAINED_SAMPLES_KEY} "
                    "(the samples it trained on) nor train/skipped"
                )
            trained = int(metrics.get(TRAINED_SAMPLES_KEY, 0))
        else:  # every group too old: nothing to learn from (counted)
            metrics.update(batch.metrics)
            metrics[SKIPPED_KEY] = 1.0
        idle, busy = self.producer.take_idle_seconds()
        metrics.update(self.lags.metrics(kept, trained))
        metrics.update({
            "async/queue_depth": float(self.queue.depth),
            "async/trainer_idle_s": waited,
            "async/rollout_idle_s": idle,
            "async/rollout_busy_s": busy,
            "async/max_staleness": float(self.plan.max_staleness),
            "timing/rollout": batch.seconds,
        })  # fmt: skip
        return metrics

    def trainer_finished(self, steps: int) -> None:
        self.producer.trainer_finished(steps)

    def state(self, step: int, weight_version: int) -> dict[str, Any]:
        """The queue's version bookkeeping at a checkpoint of `step` (JSON-safe)."""
        return {
            "trainer_version": weight_version,
            "next_index": step,
            "max_staleness": self.plan.max_staleness,
            "rollout_state": self.producer.resume_state(step),
            "lags": self.lags.state(),
            "queued_samples_at_save": self.queue.depth,
        }

    def stop(self) -> None:
        """Stop rollout (waits at most a minute for the batch in flight: the cluster's shutdown
        ends a remote call still running, and the producer thread is a daemon)."""
        self.producer.stop(min(60.0, self.plan.wait_timeout_s))


def restore_rollout_state(
    recipe: Recipe, state: dict[str, Any], step: int, weight_version: int
) -> None:
    """Resume from a checkpoint an asynchronous run wrote: its bookkeeping must name the step
    and trainer version the runner restored; the recipe's rollout side goes back to the state
    before the first batch the trainer had not consumed (what rollout drew ahead is drawn again,
    in either mode)."""
    if int(state["trainer_version"]) != weight_version or int(state["next_index"]) != step:
        raise RuntimeError(
            f"checkpoint async state (version {state['trainer_version']}, batch "
            f"{state['next_index']}) disagrees with its run state (version {weight_version}, "
            f"step {step})"
        )
    if state.get("rollout_state") is not None:
        recipe.load_rollout_state(state["rollout_state"])


def start_async_training(
    plan: AsyncPlan, recipe: Any, ctx: Any, *, samples_per_batch: int, stop_index: int,
    saved: dict[str, Any] | None = None,
) -> AsyncTraining:  # fmt: skip
    """Start rollout ahead of the trainer from the step `ctx` is at (`saved`: a resumed run's
    `state()`, whose lag totals are restored), and choose how `ctx`'s weight syncs reach the
    engines: deferred with partial rollout, staged and delivered by the producer between two
    batches when the sync can stage, else waiting for the batch in flight (`between_batches`)."""
    asynchronous = AsyncTraining(
        plan,
        recipe,
        ctx,
        samples_per_batch=samples_per_batch,
        start_index=ctx.step,
        stop_index=stop_index,
    )
    if saved:
        asynchronous.lags.load_state(saved.get("lags") or {})
    producer = asynchronous.producer
    if plan.partial_rollout:
        ctx.defer_sync = True
    elif ctx.sync is not None and ctx.sync.can_stage():
        ctx.sync_producer = producer
    else:  # the trainer's sync waits for the batch in flight to end
        ctx.sync_gate = lambda: producer.between_batches(plan.wait_timeout_s)
    asynchronous.start()
    return asynchronous


def open_rollout_gate(asynchronous: AsyncTraining, ctx: Any) -> None:
    """Tell rollout the trainer has finished `ctx.step` steps once their weights are in the
    engines: at once, when a deferred sync ends (`Context.defer_sync`) or when rollout has
    delivered a posted one (`Context.sync_producer`)."""
    steps = ctx.step
    if ctx.sync_producer is not None:
        ctx.sync_producer.when_delivered(lambda: asynchronous.trainer_finished(steps))
    elif ctx.defer_sync and ctx.sync is not None:
        ctx.sync.when_committed(lambda: asynchronous.trainer_finished(steps))
    else:
        asynchronous.trainer_finished(steps)
