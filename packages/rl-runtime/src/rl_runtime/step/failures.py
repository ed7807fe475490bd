"""Failed episodes: kept out of training, counted in metrics, and a stop when there are too many.

An episode failed when the agent loop marked it (`Trajectory.failed`: the env or engine raised,
or an env step timed out, `metrics["env_timeout"]`) or when a turn's reward could not be computed
(`info["reward_failed"]`, set by rl-envs tasks whose grader raised or timed out: their reward 0
is not data). `screen_failures` drops those episodes from the training batch, reports
`failures/*` metrics and raises `TooManyFailuresError`, naming the config key
`max_failed_fraction`, when more than that fraction of the batch failed.

`SandboxCounters` turns the cumulative `stats()` of the envs' sandbox pools (calls, failures,
timeouts, worker restarts ...) into per-rollout `sandbox/*` deltas, per split (a training step's
counts are its rollout's, never an evaluation's). rl-envs' envs reach their pool through a
handle of their own (`env.pool`, rl_envs.sandbox.CountingPool) whose stats count that env's
calls only, so a rollout's deltas are its own envs' calls even while another rollout (the other
split) uses the same pool.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: the config key (rl_config PipelineFields) that bounds the failed fraction of a batch
MAX_FAILED_FRACTION_KEY = "max_failed_fraction"


class TooManyFailuresError(RuntimeError):
    """More episodes of a training batch failed than `max_failed_fraction` allows."""


def reward_failed(trajectory: Any) -> bool:
    return any(bool(turn.info.get("reward_failed")) for turn in trajectory.turns)


def failure_kind(trajectory: Any) -> str | None:
    """`"env_timeout"`, `"error"` (env/engine raised), `"reward"` (grader failed) or None."""
    if trajectory.failed:
        return "env_timeout" if trajectory.metrics.get("env_timeout") else "error"
    return "reward" if reward_failed(trajectory) else None


@dataclass(frozen=True)
class Screened:
    """The episodes to train on and the `failures/*` metrics of the whole batch."""

    kept: list[Any]
    metrics: dict[str, float]


def screen_failures(trajectories: Sequence[Any], max_failed_fraction: float) -> Screened:
    """Drop failed episodes (see module docstring); raise if too many failed.

    Metrics: `failures/episodes` (count), `failures/fraction`, and the counts by kind
    `failures/errors`, `failures/env_timeouts`, `failures/reward_failures`.
    """
    if not 0.0 <= max_failed_fraction <= 1.0:
        raise ValueError(f"{MAX_FAILED_FRACTION_KEY} must be in [0, 1], got {max_failed_fraction}")
    kinds = [failure_kind(t) for t in trajectories]
    kept = [t for t, kind in zip(trajectories, kinds, strict=True) if kind is None]
    total = len(trajectories)
    failed = total - len(kept)
    fraction = failed / total if total else 0.0
    counts = Counter(k for k in kinds if k is not None)
    metrics = {
        "failures/episodes": float(failed),
        "failures/fraction": fraction,
        "failures/errors": float(counts["error"]),
        "failures/env_timeouts": float(counts["env_timeout"]),
        "failures/reward_failures": float(counts["reward"]),
    }
    if fraction > max_failed_fraction or (total and not kept):
        examples = [_reason(t) for t, k in zip(trajectories, kinds) if k is not None][:3]
        raise TooManyFailuresError(
            f"{failed} of {total} episodes of the training batch failed ({fraction:.0%}), more "
            f"than {MAX_FAILED_FRACTION_KEY}={max_failed_fraction:g} allows"
            + ("" if kept else " (none left to train on)")
            + f"; by kind: {dict(counts)}; e.g. {examples}"
        )
    return Screened(kept, metrics)


def _reason(trajectory: Any) -> str:
    if trajectory.error:
        return str(trajectory.error)
    for turn in trajectory.turns:
        if turn.info.get("reward_failed"):
            return f"reward: {turn.info.get('reward_error') or 'grader failed'}"
    return "failed"


class SandboxCounters:
    """Per-rollout deltas of the sandbox pools' cumulative `stats()`, kept apart per split (see
    module docstring).

    `start(envs)` snapshots the pools reachable as `env.pool` and returns the snapshot;
    `stop(snapshot, split)` adds what changed since to that split's running totals; `take(split)`
    returns them as `sandbox/<stat>` metrics and resets them. A snapshot per call, so two
    rollouts at once (a Ray actor with `max_concurrency` 2: evaluation while asynchronous rollout
    generates) do not overwrite each other's; each env's pool handle counts that env's calls
    only, so neither counts the other's (an env exposing a bare shared `SandboxPool` as `pool`
    would: its stats are every caller's).
    """

    def __init__(self) -> None:
        self._totals: dict[str, Counter[str]] = {}

    def start(self, envs: Iterable[Any]) -> dict[int, tuple[Any, dict[str, int]]]:
        pools: dict[int, tuple[Any, dict[str, int]]] = {}
        for env in envs:
            pool = getattr(env, "pool", None)
            stats = getattr(pool, "stats", None)
            if callable(stats) and id(pool) not in pools:
                pools[id(pool)] = (pool, dict(stats()))
        return pools

    def stop(self, snapshot: dict[int, tuple[Any, dict[str, int]]], split: str) -> None:
        totals = self._totals.setdefault(split, Counter())
        for pool, before in snapshot.values():
            for key, value in pool.stats().items():
                if isinstance(value, int | float):  # counts; descriptive entries (mode) are not
                    totals[key] += int(value) - int(before.get(key, 0))

    def take(self, split: str) -> dict[str, float]:
        totals = self._totals.pop(split, Counter())
        return {f"sandbox/{key}": float(value) for key, value in sorted(totals.items())}


def merge_counts(parts: Iterable[dict[str, float]]) -> dict[str, float]:
    """Sum count metrics reported by several workers (e.g. each rollout worker's `sandbox/*`)."""
    total: Counter[str] = Counter()
    for part in parts:
        total.update({k: float(v) for k, v in part.items()})
    return dict(sorted(total.items()))
