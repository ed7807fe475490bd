"""The rollout -> trainer queue of asynchronous training: bounded in samples, every wait bounded.

`RolloutBatch` is what rollout made for one training step (its `index`): trajectories (each
carrying the weight version(s) that generated it), the rollout's metrics and seconds.
`SampleQueue` holds them in order. The producer first `reserve`s room for a batch (so a finished
batch never blocks on `put`, and rollout never starts what the queue could not hold), then
`put`s it; the trainer `take`s the oldest. `close(error)` wakes every waiter: a producer error
reaches the trainer as the reason its `take` failed, never as a silent hang. Pure (threads only).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class AsyncTimeoutError(TimeoutError):
    """A wait of asynchronous training did not end within its bound (names what it waited for)."""


class QueueClosed(RuntimeError):
    """The queue was closed (the run is ending, or the producer failed: see `__cause__`)."""


@dataclass
class RolloutBatch:
    """Rollout's output for training step `index`: `trajectories` (Trajectory records; a GRPO
    group shares `group_id`), rollout `metrics`, and the `seconds` rollout took."""

    index: int
    trajectories: list[Any]
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def num_samples(self) -> int:
        return len(self.trajectories)


@dataclass
class PendingBatch:
    """A rollout batch generated but not finished (decoded, scored, made into trajectories):
    `finish()` completes it. The rollout producer finishes it off its generation, on a thread
    of its own, while the next batch is generated (reward scoring overlaps generation);
    `finish` must not touch what the recipe's `rollout_state` records, since the next batch
    may have begun by then."""

    index: int
    finish: Callable[[], RolloutBatch]


def finished(batch: RolloutBatch | PendingBatch) -> RolloutBatch:
    """`batch`, finished now when it is pending (synchronous training)."""
    return batch.finish() if isinstance(batch, PendingBatch) else batch


class SampleQueue:
    """FIFO of `RolloutBatch`es holding at most `capacity` samples (queued plus reserved)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"queue capacity must be >= 1 sample, got {capacity}")
        self.capacity = capacity
        self._items: deque[RolloutBatch] = deque()
        self._queued = 0
        self._reserved = 0
        self._closed: BaseException | None = None
        self._cond = threading.Condition()

    # ------------------------------------------------------------------------------ state
    @property
    def depth(self) -> int:
        """Samples queued now (reservations not counted)."""
        with self._cond:
            return self._queued

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    # --------------------------------------------------------------------------- producer
    def reserve(self, samples: int, timeout_s: float, what: str = "room") -> float:
        """Wait until `samples` more fit (queued + reserved + samples <= capacity) and reserve
        them; returns the seconds waited. Raises AsyncTimeoutError after `timeout_s`, QueueClosed
        when closed, ValueError for a batch larger than the whole queue (it could never fit)."""
        if samples > self.capacity:
            raise ValueError(
                f"a batch of {samples} samples can never fit a queue of {self.capacity} samples "
                "(async.queue_size)"
            )
        t0 = time.perf_counter()
        with self._cond:
            self._wait(
                lambda: self._queued + self._reserved + samples <= self.capacity,
                timeout_s,
                f"rollout waited {timeout_s:g} s for queue {what} ({samples} samples; "
                f"capacity {self.capacity})",
            )
            self._reserved += samples
        return time.perf_counter() - t0

    def put(self, batch: RolloutBatch, reserved: int) -> None:
        """Queue `batch` in the room reserved for it (`reserved` samples); never blocks."""
        with self._cond:
            if self._closed is not None:
                raise QueueClosed("the queue is closed") from self._closed
            if batch.num_samples > reserved:
                raise ValueError(
                    f"rollout batch {batch.index} has {batch.num_samples} samples but reserved "
                    f"room for {reserved}"
                )
            self._reserved -= reserved
            self._items.append(batch)
            self._queued += batch.num_samples
            self._cond.notify_all()

    def release(self, reserved: int) -> None:
        """Give back a reservation that will not be used (the rollout failed or stopped)."""
        with self._cond:
            self._reserved = max(0, self._reserved - reserved)
            self._cond.notify_all()

    # ---------------------------------------------------------------------------- trainer
    def take(self, timeout_s: float, what: str = "the next rollout batch") -> RolloutBatch:
        """The oldest batch; waits at most `timeout_s` (AsyncTimeoutError names `what`)."""
        with self._cond:
            self._wait(
                lambda: bool(self._items),
                timeout_s,
                f"the trainer waited {timeout_s:g} s for {what} (queue empty; is rollout "
                "stuck? raise rpc_timeout if a batch legitimately takes longer)",
            )
            batch = self._items.popleft()
            self._queued -= batch.num_samples
            self._cond.notify_all()
            return batch

    def clear(self) -> int:
        """Drop every queued batch; returns the samples dropped."""
        with self._cond:
            dropped = self._queued
            self._items.clear()
            self._queued = 0
            self._cond.notify_all()
            return dropped

    # ----------------------------------------------------------------------------- common
    def close(self, error: BaseException | None = None) -> None:
        """Wake every waiter; later waits raise QueueClosed (from `error` when given)."""
        with self._cond:
            if self._closed is None or error is not None:
                self._closed = error or QueueClosed("the queue is closed")
            self._cond.notify_all()

    def _wait(self, ready: Callable[[], bool], timeout_s: float, message: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if ready():  # what was queued before a close is still handed out
                return
            if self._closed is not None:
                if isinstance(self._closed, QueueClosed):
                    raise self._closed
                raise QueueClosed(f"rollout failed: {self._closed}") from self._closed
            left = deadline - time.monotonic()
            if left <= 0:
                raise AsyncTimeoutError(message)
            self._cond.wait(left)
