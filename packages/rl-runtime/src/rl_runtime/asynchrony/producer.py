"""The rollout side of asynchronous training: a driver thread that generates ahead of the trainer.

`RolloutProducer(produce, queue, ...)` runs `produce(index) -> RolloutBatch` for index = start,
start + 1, ... < stop_index, in order, on its own thread; a second thread puts the batches into
the queue, in order, finishing first the ones `produce` returned pending (`PendingBatch`: e.g.
generated, not yet scored), so a batch's reward scoring overlaps the next one's generation.
Before each batch it waits for two
things: the staleness gate, that the trainer has finished (trained and synced) at least
`index - max_staleness` steps, so batch `index` is generated with weights at most
`max_staleness` versions behind the trainer that consumes it (0: only after the previous step's
sync, i.e. synchronous training); and room in the queue (`SampleQueue.reserve`). It records the
recipe's rollout state (`rollout_state()`, e.g. a prompt sampler) before each batch, so a
checkpoint can hold the state of the first batch the trainer has not consumed (what rollout
drew ahead is drawn again after a resume, never skipped).

Weight updates without partial rollout: the trainer stages its weights (a shared-memory snapshot)
and posts their delivery (`post_weights`); the producer delivers it between two batches, before
its next one or at once while it waits at the gate, and the delivery opens the gate
(`when_delivered`), so the trainer goes on training while a batch is generated. A post that finds
the last one still waiting replaces it (superseded: the engines go straight to the newer weights,
and what waited for the older delivery is called with the newer one), so the trainer never waits
for the batch in flight; it waits only for a delivery in progress (`wait_for_delivery`), whose
buffer its next snapshot may reuse. Where the weights
cannot be staged (the broadcast transport), the trainer's sync waits for the batch in flight
instead (`between_batches`). The producer chooses no weights of its own and never sleeps or
offloads an engine (asynchronous training refuses colocation: that is the async + sleep deadlock
of ROLL #253). Its waits on the trainer
poll a stop event; its remote calls are bounded by rpc_timeout inside `produce`. An exception in
`produce` closes the queue with it, so the trainer's `take` fails with that error at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from queue import Empty, Full, Queue
from typing import Any

from rl_runtime.asynchrony.queue import (
    PendingBatch,
    QueueClosed,
    RolloutBatch,
    SampleQueue,
    finished,
)

_POLL_S = 0.05


class RolloutProducer:
    def __init__(
        self,
        produce: Callable[[int], RolloutBatch | PendingBatch],
        queue: SampleQueue,
        *,
        max_staleness: int,
        samples_per_batch: int,
        start_index: int,
        stop_index: int,
        timeout_s: float,
        rollout_state: Callable[[], Any] | None = None,
    ) -> None:
        self.produce = produce
        self.queue = queue
        self.max_staleness = max_staleness
        self.samples_per_batch = samples_per_batch
        self.next_index = start_index
        self.stop_index = stop_index
        self.timeout_s = timeout_s
        self.rollout_state = rollout_state
        self.error: BaseException | None = None
        self._trainer_done = start_index
        self._snapshots: dict[int, Any] = {}
        self._idle_s = 0.0
        self._busy_s = 0.0
        self._lock = threading.Condition()
        #: held while a batch is generated (see `between_batches`)
        self.generating = threading.Lock()
        #: a weight update posted by the trainer, not yet delivered, and what waits for it
        self._posted: Callable[[], None] | None = None
        self._on_delivered: list[Callable[[], None]] = []
        #: a delivery is running (its buffer must not be overwritten: `wait_for_delivery`)
        self._delivering = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)
        #: generated batches on their way to the queue, in order, with their reservation and
        #: start time (one waits while the finisher works on the one before; None: the last)
        self._handoff: Queue[tuple[RolloutBatch | PendingBatch, int, float] | None] = Queue(1)
        self._finisher = threading.Thread(
            target=self._finish_batches, name="rollout-finisher", daemon=True
        )

    # ---------------------------------------------------------------------------- trainer
    @contextmanager
    def between_batches(self, timeout_s: float) -> Iterator[None]:
        """Hold rollout between two batches: waits (at most `timeout_s`) for the batch in flight
        to finish, and the next one starts only after the block (a weight update inside it
        reaches no generation half-way: asynchronous training without partial rollout)."""
        if not self.generating.acquire(timeout=timeout_s):
            raise TimeoutError(
                f"waited {timeout_s:.0f}s for rollout batch {self.next_index} to finish before a "
                "weight update (async.partial_rollout is false)"
            )
        try:
            yield
        finally:
            self.generating.release()

    def post_weights(self, deliver: Callable[[], None]) -> bool:
        """Hand rollout a weight update to apply between two batches (`deliver()`, e.g. from
        rl_runtime.cluster.cluster.WeightSync.stage): this thread runs it before its next batch, or at
        once while it waits for the trainer, so the trainer never waits for the batch in flight
        (asynchronous training without partial rollout, when the weights can be staged). An
        update posted earlier and not delivered yet is superseded: it is never applied, and its
        `when_delivered` callbacks run with this one's delivery (newer weights: every bound
        they open still holds). Returns whether one was superseded."""
        with self._lock:
            superseded = self._posted is not None
            self._posted = deliver
            self._lock.notify_all()
        return superseded

    def wait_for_delivery(self, timeout_s: float | None = None) -> None:
        """Until no delivery is running (at most `timeout_s`, default the producer's): what the
        trainer waits for before it stages weights into a buffer a running delivery may read.
        Not for the batch in flight, and not for a posted update (the next post supersedes
        it)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        with self._lock:
            if not self._lock.wait_for(lambda: not self._delivering, timeout):
                raise TimeoutError(f"a weight delivery to rollout ran over {timeout:.0f}s")

    def when_delivered(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the posted weight update is delivered (at once when none is
        waiting), from the thread that delivers it: the staleness gate opens with it."""
        with self._lock:
            if self._posted is not None:
                self._on_delivered.append(callback)
                return
        callback()

    def deliver_posted(self, timeout_s: float | None = None) -> None:
        """Deliver the posted weight update (if any) from the trainer's thread: after the batch
        in flight (at most `timeout_s`, default the producer's), e.g. before the next post, an
        evaluation, a checkpoint or the end of training (this thread may have stopped)."""
        with self.between_batches(self.timeout_s if timeout_s is None else timeout_s):
            self._deliver()

    def _deliver(self) -> None:
        """Run the posted update and its callbacks (the caller holds `generating`)."""
        with self._lock:
            deliver, self._posted = self._posted, None
            callbacks, self._on_delivered = self._on_delivered, []
            if deliver is None:
                return
            self._delivering = True
        try:
            deliver()
        finally:
            with self._lock:
                self._delivering = False
                self._lock.notify_all()
        for callback in callbacks:
            callback()

    def start(self) -> None:
        self._finisher.start()
        self._thread.start()

    def trainer_finished(self, steps: int) -> None:
        """The trainer has finished `steps` steps (trained and synced): opens the gate."""
        with self._lock:  # monotonic: deferred syncs may report their ends out of order
            self._trainer_done = max(self._trainer_done, steps)
            self._lock.notify_all()

    def take_idle_seconds(self) -> tuple[float, float]:
        """(seconds rollout waited for the trainer or queue room, seconds it generated) since
        the last take."""
        with self._lock:
            out = (self._idle_s, self._busy_s)
            self._idle_s = self._busy_s = 0.0
            return out

    def resume_state(self, next_index: int) -> Any:
        """The recipe's rollout state before batch `next_index` (the first one the trainer has
        not consumed): its snapshot, or the current state when rollout has not begun it; None
        for a recipe without rollout state (its batches are a function of their index, e.g. the
        agentic recipe's env seeds: nothing to record, wherever rollout is)."""
        if self.rollout_state is None:
            return None
        with self._lock:
            for old in [i for i in self._snapshots if i < next_index]:
                del self._snapshots[old]
            if next_index in self._snapshots:
                return self._snapshots[next_index]
            if self.next_index != next_index:
                raise RuntimeError(
                    f"no rollout state recorded for batch {next_index} (rollout is at "
                    f"{self.next_index})"
                )
            return self.rollout_state()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop after the batch in progress (waits at most `timeout_s` for it)."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        self.queue.close()
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        for thread in (self._thread, self._finisher):
            if thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() or self._finisher.is_alive()

    # --------------------------------------------------------------------------- producer
    def _gate_open(self, index: int) -> bool:
        return self._trainer_done >= index - self.max_staleness

    def _wait_for_gate(self, index: int) -> None:
        """Wait (polling the stop event; no deadline of its own: the trainer's calls are bounded
        and a failed trainer stops the producer) until batch `index` may start, delivering the
        weight updates the trainer posts meanwhile (the one that opens the gate among them)."""
        while True:
            with self._lock:
                if self._gate_open(index) or self._stop.is_set():
                    return
                if self._posted is None:
                    self._lock.wait(_POLL_S)
                    continue
            with self.generating:
                self._deliver()

    def _run(self) -> None:
        reserved = 0
        try:
            while self.next_index < self.stop_index and not self._stop.is_set():
                index = self.next_index
                t0 = time.perf_counter()
                self._wait_for_gate(index)
                if self._stop.is_set():
                    break
                self.queue.reserve(self.samples_per_batch, self.timeout_s, f"room for {index}")
                reserved = self.samples_per_batch
                with self._lock:
                    if self.rollout_state is not None:
                        self._snapshots[index] = self.rollout_state()
                    self._idle_s += time.perf_counter() - t0
                if self._stop.is_set():
                    break
                t1 = time.perf_counter()
                with self.generating:
                    self._deliver()  # an update posted since the gate opened
                    batch = self.produce(index)
                generated = time.perf_counter() - t1
                if batch.index != index:
                    raise RuntimeError(f"produce({index}) returned batch {batch.index}")
                if not self._hand_off((batch, reserved, t1)):
                    break
                reserved = 0
                with self._lock:
                    self._busy_s += generated
                    self.next_index = index + 1
        except QueueClosed:
            pass  # the run is ending
        except BaseException as exc:  # handed to the trainer through the queue
            self._fail(exc)
        finally:
            if reserved:
                self.queue.release(reserved)
            self._hand_off(None)  # the finisher ends after the batches before it

    def _hand_off(self, item: tuple[RolloutBatch | PendingBatch, int, float] | None) -> bool:
        """Pass `item` to the finisher (waits while one is already waiting); False when the
        run stopped first."""
        while not self._stop.is_set() or item is None:
            try:
                self._handoff.put(item, timeout=_POLL_S)
                return True
            except Full:
                if item is None and self._stop.is_set():
                    return False  # stopping: the finisher ends on the stop event
        return False

    def _finish_batches(self) -> None:
        """The finisher thread: finish each handed-off batch (`PendingBatch.finish`, off the
        generation lock) and queue it, in order; its error ends the run like `produce`'s."""
        while True:
            try:
                item = self._handoff.get(timeout=_POLL_S)
            except Empty:
                if self._stop.is_set():
                    return
                continue
            if item is None:
                return
            pending, reserved, t1 = item
            try:
                batch = finished(pending)
                if batch.index != pending.index:
                    raise RuntimeError(
                        f"finishing rollout batch {pending.index} gave batch {batch.index}"
                    )
                batch.seconds = time.perf_counter() - t1
                self.queue.put(batch, reserved)
            except QueueClosed:
                self.queue.release(reserved)
                return  # the run is ending
            except BaseException as exc:
                self.queue.release(reserved)
                self._fail(exc)
                return

    def _fail(self, exc: BaseException) -> None:
        """Hand `exc` to the trainer (its `take` raises it) and stop rollout."""
        self.error = exc
        self.queue.close(exc)
        self._stop.set()
