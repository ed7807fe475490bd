"""Env groups (ROLL's train/val_env_manager) and concurrent stepping with per-call timeouts.

``num_env_groups`` groups of ``group_size`` envs; every env of a group has the same tag, config
and seed (the GRPO group). Groups are split among ``tags`` by ``num_groups_partition`` (equal
split when absent). Seeds depend only on (``seed``, epoch, group id): deterministic across runs.
``worker_partition`` packs envs into chunks of at most ``max_env_num_per_worker``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rl_envs.base import Env
from rl_envs.registry import make_env


@dataclass(frozen=True)
class EnvAssignment:
    env_id: int
    group_id: int
    index_in_group: int
    tag: str
    seed: int


@dataclass
class EnvSlot:
    """One env and the state of its current trajectory."""

    assignment: EnvAssignment
    env: Env
    failed: bool = False
    error: str = ""
    done: bool = False


class EnvGroupManager:
    def __init__(
        self,
        *,
        tags: Sequence[str],
        num_env_groups: int,
        group_size: int = 1,
        num_groups_partition: Sequence[int] | None = None,
        max_env_num_per_worker: int = 0,
        seed: int = 0,
        format_penalty: float | None = None,
        env_configs: Mapping[str, Mapping[str, Any]] | None = None,
        env_factory: Callable[..., Env] = make_env,
    ) -> None:
        if not tags:
            raise ValueError("tags must name at least one env tag")
        if num_env_groups < 1 or group_size < 1:
            raise ValueError(
                f"num_env_groups and group_size must be >= 1 ({num_env_groups}, {group_size})"
            )
        if num_groups_partition is None:
            base, extra = divmod(num_env_groups, len(tags))
            num_groups_partition = [base + (1 if i < extra else 0) for i in range(len(tags))]
        if len(num_groups_partition) != len(tags):
            raise ValueError(
                f"num_groups_partition has {len(num_groups_partition)} entries for {len(tags)} tags"
            )
        if sum(num_groups_partition) != num_env_groups:
            raise ValueError(
                f"num_groups_partition {list(num_groups_partition)} sums to "
                f"{sum(num_groups_partition)}, not num_env_groups={num_env_groups}"
            )
        self.tags = list(tags)
        self.num_env_groups = num_env_groups
        self.group_size = group_size
        self.num_groups_partition = list(num_groups_partition)
        self.max_env_num_per_worker = max_env_num_per_worker
        self.seed = seed
        self.format_penalty = format_penalty
        self.env_configs = {k: dict(v) for k, v in (env_configs or {}).items()}
        self._factory = env_factory
        self._envs: dict[int, Env] = {}
        self._group_tags = [
            t for t, n in zip(self.tags, self.num_groups_partition) for _ in range(n)
        ]

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Any, **kwargs: Any) -> EnvGroupManager:
        """From a ROLL ``train_env_manager`` mapping or object (unknown keys are ignored)."""
        keys = ("tags", "num_env_groups", "group_size", "num_groups_partition",
                "max_env_num_per_worker", "format_penalty", "seed")  # fmt: skip
        get = config.get if isinstance(config, Mapping) else lambda k, d=None: getattr(config, k, d)
        values = {k: get(k) for k in keys if get(k) is not None}
        return cls(**{**values, **kwargs})

    @property
    def num_envs(self) -> int:
        return self.num_env_groups * self.group_size

    def group_seed(self, epoch: int, group_id: int) -> int:
        state = np.random.SeedSequence([self.seed, epoch, group_id]).generate_state(1)
        return int(state[0] % (2**31 - 1))

    def assignments(self, epoch: int) -> list[EnvAssignment]:
        out = []
        for group_id, tag in enumerate(self._group_tags):
            seed = self.group_seed(epoch, group_id)
            for k in range(self.group_size):
                out.append(EnvAssignment(group_id * self.group_size + k, group_id, k, tag, seed))
        return out

    def worker_partition(self, epoch: int = 0) -> list[list[EnvAssignment]]:
        items = self.assignments(epoch)
        size = self.max_env_num_per_worker if self.max_env_num_per_worker > 0 else len(items)
        return [items[i : i + size] for i in range(0, len(items), size)]

    def _env(self, assignment: EnvAssignment) -> Env:
        env = self._envs.get(assignment.env_id)
        if env is None:
            config = dict(self.env_configs.get(assignment.tag, {}))
            if self.format_penalty is not None:
                config.setdefault("format_penalty", self.format_penalty)
            env = self._factory(assignment.tag, **config)
            self._envs[assignment.env_id] = env
        return env

    def slots(self, epoch: int) -> list[EnvSlot]:
        """Fresh slots (envs reused across epochs, not yet reset)."""
        return [EnvSlot(a, self._env(a)) for a in self.assignments(epoch)]


@dataclass
class StepOutcome:
    env_id: int
    ok: bool
    value: Any = None
    error: str = ""
    seconds: float = 0.0


@dataclass
class _Job:
    fn: Callable[[], Any]
    future: Future[Any] = field(default_factory=Future)


class ConcurrentStepper:
    """Runs env calls on daemon threads with a per-call timeout.

    A call that raises or exceeds ``timeout_s`` marks its slot failed (counted in ``stats``) and
    the others go on; a hung thread is abandoned and replaced, so it never stalls later calls or
    interpreter exit.
    """

    def __init__(self, max_workers: int = 8, timeout_s: float = 30.0) -> None:
        self.max_workers = max_workers
        self.timeout_s = timeout_s
        self.stats: Counter[str] = Counter()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._threads = 0
        self._busy = 0
        self._closed = False

    def _worker(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                self._busy += 1
            try:
                if job.future.set_running_or_notify_cancel():
                    try:
                        job.future.set_result(job.fn())
                    except BaseException as exc:
                        job.future.set_exception(exc)
            finally:
                with self._lock:
                    self._busy -= 1

    def _ensure_threads(self, pending: int) -> None:
        with self._lock:
            idle = self._threads - self._busy
            want = min(pending, self.max_workers + self.stats["hung_threads"]) - idle
            for _ in range(max(want, 0)):
                threading.Thread(target=self._worker, name="env-step", daemon=True).start()
                self._threads += 1

    def map(
        self, calls: Mapping[int, Callable[[], Any]], timeout_s: float | None = None
    ) -> dict[int, StepOutcome]:
        """Run ``calls`` (env_id -> thunk) concurrently; outcomes by env_id."""
        if self._closed:
            raise RuntimeError("ConcurrentStepper is closed")
        limit = self.timeout_s if timeout_s is None else timeout_s
        jobs = {env_id: _Job(fn) for env_id, fn in calls.items()}
        self._ensure_threads(len(jobs))
        start = time.monotonic()
        for job in jobs.values():
            self._jobs.put(job)
        outcomes: dict[int, StepOutcome] = {}
        for env_id, job in jobs.items():
            remaining = max(start + limit - time.monotonic(), 0.0)
            try:
                value = job.future.result(timeout=remaining)
                outcomes[env_id] = StepOutcome(
                    env_id, True, value, seconds=time.monotonic() - start
                )
            except FutureTimeoutError:  # not the builtin TimeoutError on Python 3.10
                if job.future.cancel():
                    error = f"not started within {limit:.1f} s"
                else:
                    error = f"env call exceeded {limit:.1f} s"
                    with self._lock:
                        self._threads -= 1  # abandoned; a new thread takes its place
                    self.stats["hung_threads"] += 1
                self.stats["timeouts"] += 1
                outcomes[env_id] = StepOutcome(env_id, False, error=error, seconds=limit)
            except BaseException as exc:
                self.stats["errors"] += 1
                outcomes[env_id] = StepOutcome(
                    env_id, False, error=f"{type(exc).__name__}: {exc}"[:2000]
                )
        self.stats["calls"] += len(jobs)
        return outcomes

    def reset_all(self, slots: Sequence[EnvSlot]) -> dict[int, StepOutcome]:
        calls = {
            s.assignment.env_id: (lambda s=s: s.env.reset(seed=s.assignment.seed)) for s in slots
        }
        return self._apply(slots, self.map(calls))

    def step_all(
        self, slots: Sequence[EnvSlot], actions: Mapping[int, str]
    ) -> dict[int, StepOutcome]:
        """Step every live slot that has an action; failed or done slots are skipped."""
        live = [s for s in slots if not s.failed and not s.done and s.assignment.env_id in actions]
        calls = {
            s.assignment.env_id: (lambda s=s: s.env.step(actions[s.assignment.env_id]))
            for s in live
        }
        outcomes = self._apply(live, self.map(calls))
        for slot in live:
            outcome = outcomes[slot.assignment.env_id]
            if outcome.ok:
                _, _, terminated, truncated, _ = outcome.value
                slot.done = bool(terminated or truncated)
        return outcomes

    @staticmethod
    def _apply(
        slots: Sequence[EnvSlot], outcomes: dict[int, StepOutcome]
    ) -> dict[int, StepOutcome]:
        for slot in slots:
            outcome = outcomes.get(slot.assignment.env_id)
            if outcome is not None and not outcome.ok:
                slot.failed = True
                slot.error = outcome.error
        return outcomes

    def close(self) -> None:
        self._closed = True
        for _ in range(self._threads):
            self._jobs.put(None)
