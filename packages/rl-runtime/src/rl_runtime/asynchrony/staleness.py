"""The staleness bound of asynchronous training and the policy-lag statistics.

A sample's lag is `trainer_version - oldest_weight_version(sample)` (rl_config.records: the
oldest weight version that produced any of its model tokens). `filter_stale` keeps the samples
whose lag is at most `max_staleness` and drops the rest, a whole group at a time (a GRPO group's
advantages are relative to its members, so a group is trained on whole or not at all; its lag is
its oldest member's). A negative lag (a sample from weights newer than the trainer's) means the
version bookkeeping is broken, e.g. a resume that restored the trainer but not the engines: an
error, never trained on. `LagStats` turns lags and trained samples into `async/*` metrics. Pure
(no torch, no Ray).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rl_config.records import oldest_weight_version


class StalenessError(RuntimeError):
    """A sample's weight version is newer than the trainer's (broken version bookkeeping)."""


@dataclass
class Filtered:
    """`kept` trajectories (in their original order), the number `dropped`, and the lag of every
    kept sample (aligned with `kept`)."""

    kept: list[Any]
    dropped: int
    lags: list[int]


def filter_stale(trajectories: Sequence[Any], trainer_version: int, max_staleness: int) -> Filtered:
    """Keep the groups (by `group_id`) whose oldest sample lags at most `max_staleness` versions
    behind `trainer_version`; the lag of a kept sample is its own."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    lags = [trainer_version - oldest_weight_version(t) for t in trajectories]
    for t, lag in zip(trajectories, lags, strict=True):
        if lag < 0:
            raise StalenessError(
                f"trajectory {t.traj_id!r} was generated with weight version "
                f"{oldest_weight_version(t)}, newer than the trainer's {trainer_version}: the "
                "engines and the trainer disagree on the weight version (a resume that restored "
                "one but not the other?)"
            )
    worst: dict[str, int] = defaultdict(int)
    for t, lag in zip(trajectories, lags, strict=True):
        worst[t.group_id] = max(worst[t.group_id], lag)
    keep = [worst[t.group_id] <= max_staleness for t in trajectories]
    return Filtered(
        kept=[t for t, k in zip(trajectories, keep, strict=True) if k],
        dropped=sum(not k for k in keep),
        lags=[lag for lag, k in zip(lags, keep, strict=True) if k],
    )


class LagStats:
    """Policy lag of the samples the staleness bound kept, per step, and the run's totals
    (`async/*` metrics). The lags are those of what the recipe's `learn` gets, which may still
    screen some out (failed episodes, `failures/*`; RLVR's filters): `async/lag_hist/*` of a
    step adds up to the samples kept. `async/trained_samples_total` counts the samples trained
    on, what reached train_step after that screening (`trained` of each step: the step's
    `rollout/num_trajectories`), so over the run it adds up to `rollout/num_trajectories`."""

    def __init__(self, max_staleness: int) -> None:
        self.max_staleness = max_staleness
        self.total_trained = 0
        self.total_dropped = 0

    def metrics(self, filtered: Filtered, trained: int) -> dict[str, float]:
        """`async/lag_mean`, `async/lag_max`, `async/lag_hist/<k>` (samples at lag k, k = 0 ..
        max_staleness), `async/dropped_stale_samples` (this step) and the run's totals, with
        `trained` the samples of `filtered.kept` that this step trained on."""
        if not 0 <= trained <= len(filtered.kept):
            raise ValueError(
                f"trained={trained} samples, but the staleness bound kept {len(filtered.kept)}"
            )
        self.total_trained += trained
        self.total_dropped += filtered.dropped
        lags = filtered.lags
        out = {
            "async/lag_mean": sum(lags) / len(lags) if lags else 0.0,
            "async/lag_max": float(max(lags, default=0)),
            "async/dropped_stale_samples": float(filtered.dropped),
            "async/dropped_stale_total": float(self.total_dropped),
            "async/trained_samples_total": float(self.total_trained),
        }
        for k in range(self.max_staleness + 1):
            out[f"async/lag_hist/{k}"] = float(sum(lag == k for lag in lags))
        return out

    def state(self) -> dict[str, int]:
        return {"total_trained": self.total_trained, "total_dropped": self.total_dropped}

    def load_state(self, state: dict[str, Any]) -> None:
        # "total_kept": a checkpoint written before failed samples were told apart (it counted
        # every sample the staleness bound kept; the best total such a checkpoint holds)
        self.total_trained = int(state.get("total_trained", state.get("total_kept", 0)))
        self.total_dropped = int(state.get("total_dropped", 0))
