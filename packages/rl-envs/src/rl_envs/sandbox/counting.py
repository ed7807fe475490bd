"""One caller's counts of its sandbox calls, apart from the pool's totals.

``SandboxPool.stats()`` counts every call made through the pool, whoever made it. Where callers
share a pool at the same time (the process-wide grading pool of a rollout worker that plays an
evaluation while asynchronous rollout plays training episodes), its totals cannot say whose
calls they were, and a caller's before/after difference counts the others' calls too.
``CountingPool(pool)`` is one caller's handle on a pool: the same calls, and a ``stats()`` of its
own, with the pool's keys, that counts only the calls made through it, and the batches, batch
fallbacks, worker restarts and failed worker starts those calls caused. The envs that grade or
run tools in the sandbox each use one (``env.pool``), so an env's stats are its own episode's.

How: while a call made through a handle runs, the handle's ``Tally`` is one of the calling
context's active tallies (a context variable: per thread and per asyncio task); the pool adds
each count to its own totals and to every active tally (nested handles all count).
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_envs.sandbox.pool import SandboxPool, SandboxResult


class Tally:
    """Sandbox counts (``calls``, ``kind.<kind>`` ...), safe to add to from any thread."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


_active: ContextVar[tuple[Tally, ...]] = ContextVar("rl_envs_sandbox_tallies", default=())


def active_tallies() -> tuple[Tally, ...]:
    """The tallies the calling context's sandbox calls count into (see module docstring)."""
    return _active.get()


@contextlib.contextmanager
def counting_into(tally: Tally) -> Iterator[None]:
    """Count the sandbox calls made in this context, until the block ends, into `tally` too."""
    token = _active.set((*_active.get(), tally))
    try:
        yield
    finally:
        _active.reset(token)


def stats_report(counts: Mapping[str, int], isolation: Mapping[str, Any]) -> dict[str, Any]:
    """``SandboxPool.stats()``'s shape for `counts`: ``calls``, ``failures``, ``timeouts``,
    ``worker_restarts``, ``worker_start_failures`` (0 when absent), every other count, and the
    ``isolation`` mode plus ``isolation.<aspect>`` strings of `isolation` (a pool's report)."""
    counters = Counter({"calls": 0, "failures": 0, "worker_restarts": 0,
                        "worker_start_failures": 0})  # fmt: skip
    counters.update(counts)
    out: dict[str, Any] = dict(counters)
    out["timeouts"] = counters["kind.timeout"]
    report = dict(isolation)
    out["isolation"] = report.pop("mode")
    out.update({f"isolation.{k}": str(v) for k, v in report.items()})
    return out


class CountingPool:
    """One caller's handle on `pool` (see module docstring): ``call``, ``call_each``,
    ``call_source`` and ``run_python`` as the pool's, ``stats()`` of the calls made through
    this handle only; ``pool`` is the shared pool itself."""

    def __init__(self, pool: SandboxPool) -> None:
        self.pool = pool
        self._tally = Tally()

    @classmethod
    def of(cls, pool: SandboxPool | None) -> CountingPool:
        """A new handle on `pool`, or on the process-wide grading pool (rl_envs.sandbox.shared,
        started now if need be) when None."""
        if pool is None:
            from rl_envs.sandbox.shared import shared_pool

            pool = shared_pool()
        return cls(pool)

    def call(self, target: str, *args: Any, timeout_s: float | None = None,
             **kwargs: Any) -> SandboxResult:  # fmt: skip
        with counting_into(self._tally):
            return self.pool.call(target, *args, timeout_s=timeout_s, **kwargs)

    def call_each(
        self,
        target: str,
        calls: list[tuple[list[Any], dict[str, Any]]],
        *,
        timeout_s: float | None = None,
    ) -> list[SandboxResult]:
        with counting_into(self._tally):
            return self.pool.call_each(target, calls, timeout_s=timeout_s)

    def call_source(self, source: str, function: str, args: tuple[Any, ...] | list[Any] = (),
                    kwargs: dict[str, Any] | None = None, *, filename: str = "reward_fn.py",
                    timeout_s: float | None = None) -> SandboxResult:  # fmt: skip
        with counting_into(self._tally):
            return self.pool.call_source(source, function, args, kwargs, filename=filename,
                                         timeout_s=timeout_s)  # fmt: skip

    def run_python(self, code: str, *, timeout_s: float | None = None) -> SandboxResult:
        with counting_into(self._tally):
            return self.pool.run_python(code, timeout_s=timeout_s)

    def stats(self) -> dict[str, Any]:
        """``SandboxPool.stats()`` of the calls made through this handle (the pool's isolation)."""
        return stats_report(self._tally.counts(), self.pool.isolation)

    @property
    def isolation(self) -> dict[str, Any]:
        return self.pool.isolation
