"""The `async` section (and ROLL's `async_generation_ratio`) -> `AsyncPlan`, or None (synchronous).

ROLL's `async_generation_ratio` r (rollout may run r rollout batches ahead of training) maps onto
`async.max_staleness = ceil(r)` weight versions (rl_config derives it when `max_staleness` is
unset): a batch generated while the trainer was k steps behind is trained with lag <= k, so r
batches ahead is a lag bound of ceil(r). verl's one-step-off pipeline is `max_staleness: 1`.
`max_staleness: 0` is synchronous training and returns None (the runner's synchronous loop).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rl_config.rules import ASYNC_COLOCATION, shared_with_infer


@dataclass(frozen=True)
class AsyncPlan:
    """Rollout running ahead of training (rl_runtime.asynchrony.training).

    max_staleness: weight versions a sample may lag behind the trainer (trainer_version -
    oldest_weight_version(sample) <= max_staleness, older samples are dropped and counted);
    queue_samples: capacity of the rollout -> trainer queue in samples (at least one step's
    batch); wait_timeout_s: bound of every wait on the queue or the producer (rpc_timeout);
    source: where the bound came from (dry-run text); partial_rollout: a weight update lands in
    the generations in flight (the engines swap at a decode-step boundary and continue under the
    new version, tokens keeping the version that sampled them); without it the update waits for
    the rollout batch in flight and the next batch starts under the new weights (verl's
    one-step-off).
    """

    max_staleness: int
    queue_samples: int
    wait_timeout_s: float
    source: str
    partial_rollout: bool = False


def build_async(cfg: Any, samples_per_step: int, warnings: list[str]) -> AsyncPlan | None:
    """The async plan of a validated config, None when synchronous. ValueError names the key
    (a queue smaller than one step's batch could never hold a batch: the run would hang)."""
    section = cfg.async_
    staleness = int(section.max_staleness or 0)
    ratio = float(cfg.async_generation_ratio)
    queue = section.queue_size
    partial_rollout = bool(section.partial_rollout)  # rl_config's rules refuse it when synchronous
    correction = cfg.train_infer_correction
    if staleness == 0:
        if queue is not None:
            warnings.append(
                f"async.queue_size={queue} has no effect: max_staleness is 0 (synchronous)"
            )
        return None
    # unset: rl_config's default, one step's samples per version of staleness (its one home)
    queue = int(queue)
    if queue < samples_per_step:
        raise ValueError(
            f"async.queue_size={queue} is smaller than one step's batch ({samples_per_step} "
            "samples): rollout could never queue a batch; set it to at least samples_per_step"
        )
    for role, shared in shared_with_infer(cfg, unset=(0,)).items():
        raise ValueError(
            f"{role}.device_mapping shares devices {shared} with actor_infer: {ASYNC_COLOCATION}"
        )
    if not correction.is_weight.enabled and not any(f.enabled for f in correction.filters):
        warnings.append(
            f"async.max_staleness={staleness} without train_infer_correction (is_weight or "
            "filters): samples up to that many versions old are trained without an importance "
            "correction against the engine's behaviour log-probs"
        )
    source = (
        f"async_generation_ratio={ratio:g} -> max_staleness={staleness}"
        if ratio > 0 and staleness == math.ceil(ratio)
        else f"async.max_staleness={staleness}"
    )
    return AsyncPlan(
        max_staleness=staleness,
        queue_samples=queue,
        wait_timeout_s=float(cfg.rpc_timeout),
        source=source,
        partial_rollout=partial_rollout,
    )
