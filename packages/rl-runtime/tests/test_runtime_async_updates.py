"""Weight updates posted while rollout runs ahead (without Ray): a post returns at once and lands
between batches, within the staleness bound; superseded and failed deliveries."""

from __future__ import annotations

import threading
import time

import pytest
from async_fakes import traj

from rl_runtime.asynchrony.producer import RolloutProducer
from rl_runtime.asynchrony.queue import (
    QueueClosed,
    RolloutBatch,
    SampleQueue,
)


# ----------------------------------------------------------------- weight updates posted
class Engine:
    """What the posted deliveries change: the engine's weight version, and whether a batch was
    being generated when one landed."""

    def __init__(self) -> None:
        self.version = 0
        self.generating = False
        self.events: list[str] = []

    def deliverer(self, version: int):
        def deliver() -> None:
            assert not self.generating, f"version {version} delivered during a batch"
            self.version = version
            self.events.append(f"deliver {version}")

        return deliver

    def produce(
        self, index: int, hold: threading.Event | None = None, pause_s: float = 0.01
    ) -> RolloutBatch:
        self.generating = True
        self.events.append(f"start {index} on {self.version}")
        if hold is not None:
            assert hold.wait(5.0)
        time.sleep(pause_s)
        self.events.append(f"end {index}")
        self.generating = False
        return RolloutBatch(index, [traj(f"g{index}", self.version)])


def producer_in_batch_one(
    engine: Engine, hold: threading.Event
) -> tuple[RolloutProducer, SampleQueue]:
    """A one-step-off producer of 3 batches whose batch 0 the trainer has taken and whose
    batch 1 is being generated on version 0, held there until `hold` is set."""
    q = SampleQueue(4)
    producer = RolloutProducer(
        lambda i: engine.produce(i, hold if i == 1 else None), q, max_staleness=1,
        samples_per_batch=1, start_index=0, stop_index=3, timeout_s=5.0,
    )  # fmt: skip
    producer.start()
    assert q.take(5.0).index == 0
    deadline = time.monotonic() + 5
    while "start 1 on 0" not in engine.events and time.monotonic() < deadline:
        time.sleep(0.005)
    return producer, q


def test_a_posted_update_returns_at_once_and_lands_between_batches():
    """Without partial rollout, the trainer posts its staged weights while a batch is generated
    and goes on (it does not wait for the batch); the update reaches the engine after that
    batch and before the next, and opens the gate of the batch that needs it."""
    engine, hold = Engine(), threading.Event()
    producer, q = producer_in_batch_one(engine, hold)
    t0 = time.perf_counter()
    producer.post_weights(engine.deliverer(1))  # batch 1 is being generated
    producer.when_delivered(lambda: producer.trainer_finished(1))
    assert time.perf_counter() - t0 < 0.5 and engine.version == 0
    hold.set()
    assert q.take(5.0).index == 1
    assert q.take(5.0).index == 2
    producer.stop(5.0)
    assert engine.events == [
        "start 0 on 0", "end 0", "start 1 on 0", "end 1", "deliver 1", "start 2 on 1", "end 2",
    ]  # fmt: skip


def train_posting_each_step(
    engine: Engine, staleness: int, steps: int, train_s: float, generate_s: float
) -> list[bool]:
    """A trainer that posts each step's weights as the runner does (rl_runtime.run.runner
    `Context._push_weights`: wait for a running delivery, stage, post; the delivery opens the
    gate); returns whether each post superseded one still waiting."""
    q = SampleQueue(10)
    producer = RolloutProducer(
        lambda i: engine.produce(i, pause_s=generate_s), q, max_staleness=staleness,
        samples_per_batch=1, start_index=0, stop_index=steps, timeout_s=5.0,
    )  # fmt: skip
    producer.start()
    superseded = []
    try:
        for step in range(steps):
            assert q.take(5.0).index == step
            time.sleep(train_s)  # training
            producer.wait_for_delivery()
            superseded.append(producer.post_weights(engine.deliverer(step + 1)))
            producer.when_delivered(lambda s=step: producer.trainer_finished(s + 1))
        producer.deliver_posted()  # the end of training: the engines hold the last weights
    finally:
        producer.stop(5.0)
    return superseded


def batch_starts(engine: Engine) -> list[tuple[int, int]]:
    """(batch index, weight version it started on) of every batch, in order."""
    starts = [e.split() for e in engine.events if e.startswith("start")]
    return [(int(index), int(version)) for _, index, _, version in starts]


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_posted_updates_keep_every_batch_within_the_staleness_bound(staleness):
    """A trainer that posts each step's weights (delivered by rollout, which then opens the
    gate): batch `index` always starts on weights at least `index - staleness` versions new,
    and with staleness 0 exactly on the previous step's (synchronous)."""
    engine = Engine()
    train_posting_each_step(engine, staleness, steps=8, train_s=0.02, generate_s=0.01)
    assert engine.version == 8
    starts = batch_starts(engine)
    assert [index for index, _ in starts] == list(range(8))
    for index, version in starts:
        assert index - version <= staleness
    if staleness == 0:
        assert all(index == version for index, version in starts)
    else:
        assert any(index - version == staleness for index, version in starts)


@pytest.mark.parametrize("staleness", [1, 2])
def test_a_trainer_faster_than_rollout_supersedes_waiting_updates_within_the_bound(staleness):
    """When the trainer posts again before rollout ended its batch, the waiting update is
    superseded: never applied (the engines go straight to the newer weights), the gate still
    opens for its step, and every batch starts within the bound. Before 2026-11-25 the trainer
    waited for the batch in flight to deliver the last update itself."""
    engine = Engine()
    superseded = train_posting_each_step(
        engine, staleness, steps=10, train_s=0.002, generate_s=0.05
    )
    assert engine.version == 10 and any(superseded)
    delivered = [int(e.split()[1]) for e in engine.events if e.startswith("deliver")]
    assert delivered == sorted(delivered) and delivered[-1] == 10
    skipped = set(range(1, 11)) - set(delivered)
    assert len(skipped) == sum(superseded)  # each superseded version is one never applied
    for index, version in batch_starts(engine):
        assert index - version <= staleness


def test_a_failed_delivery_reaches_the_trainer_and_a_waiting_post_is_superseded():
    def fail() -> None:
        raise RuntimeError("receive_weights_handle failed remotely")

    engine = Engine()
    q = SampleQueue(4)
    producer = RolloutProducer(engine.produce, q, max_staleness=0, samples_per_batch=1,
                               start_index=0, stop_index=3, timeout_s=5.0)  # fmt: skip
    producer.start()
    q.take(5.0)
    producer.post_weights(fail)  # rollout waits at the gate of batch 1: it delivers at once
    with pytest.raises(QueueClosed, match="failed remotely"):
        q.take(5.0)
    producer.stop(5.0)
    idle = RolloutProducer(engine.produce, SampleQueue(4), max_staleness=0, samples_per_batch=1,
                           start_index=0, stop_index=0, timeout_s=5.0)  # fmt: skip
    opened: list[int] = []
    assert not idle.post_weights(engine.deliverer(1))
    idle.when_delivered(lambda: opened.append(1))
    assert idle.post_weights(engine.deliverer(2))  # 1 still waits: superseded
    idle.when_delivered(lambda: opened.append(2))
    assert opened == []
    idle.deliver_posted()  # no thread runs: the trainer delivers it itself
    assert engine.version == 2 and engine.events[-1:] == ["deliver 2"] and opened == [1, 2]
    assert "deliver 1" not in engine.events
    idle.post_weights(fail)
    with pytest.raises(RuntimeError, match="failed remotely"):
        idle.deliver_posted()


def test_the_trainer_waits_for_a_running_delivery_not_for_the_batch_in_flight():
    """`wait_for_delivery` returns at once while a batch is generated (the trainer's next
    snapshot may go on), blocks while a delivery runs (its buffer may be the next one's), and
    times out with a clear error when a delivery hangs."""
    engine, hold = Engine(), threading.Event()
    in_delivery, release = threading.Event(), threading.Event()
    producer, q = producer_in_batch_one(engine, hold)
    t0 = time.perf_counter()
    producer.wait_for_delivery()  # batch 1 is being generated: no wait
    assert time.perf_counter() - t0 < 0.5

    def slow_delivery() -> None:
        in_delivery.set()
        assert release.wait(5.0)
        engine.deliverer(1)()

    producer.post_weights(slow_delivery)
    producer.when_delivered(lambda: producer.trainer_finished(1))
    hold.set()  # batch 1 ends: rollout delivers
    assert in_delivery.wait(5.0)
    with pytest.raises(TimeoutError, match="weight delivery to rollout ran over"):
        producer.wait_for_delivery(0.1)
    threading.Timer(0.2, release.set).start()
    t0 = time.perf_counter()
    producer.wait_for_delivery()
    assert time.perf_counter() - t0 >= 0.15 and engine.version == 1
    assert [q.take(5.0).index for _ in range(2)] == [1, 2]
    producer.stop(5.0)


# --------------------------------------------------------------------------------- compose
def test_between_batches_waits_for_the_batch_in_flight_and_holds_the_next():
    """Asynchronous training without partial rollout: a weight update waits for the batch being
    generated and the next batch starts only after the update."""
    release = threading.Event()
    events: list[str] = []

    def produce(index: int) -> RolloutBatch:
        events.append(f"start {index}")
        if index == 0:
            assert release.wait(5.0)
        events.append(f"end {index}")
        return RolloutBatch(index, [traj(f"g{index}", 0)])

    q = SampleQueue(4)
    producer = RolloutProducer(produce, q, max_staleness=0, samples_per_batch=1, start_index=0,
                               stop_index=2, timeout_s=5.0)  # fmt: skip
    producer.start()
    deadline = time.monotonic() + 5
    while not events and time.monotonic() < deadline:
        time.sleep(0.01)
    with (
        pytest.raises(TimeoutError, match="rollout batch 0 to finish"),
        producer.between_batches(0.1),
    ):
        pass
    release.set()
    q.take(5.0)
    with producer.between_batches(5.0):
        events.append("update")
        producer.trainer_finished(1)  # the gate of batch 1 opens inside the update ...
        time.sleep(0.2)  # ... but batch 1 must wait for the update to end
    q.take(5.0)
    producer.stop(5.0)
    assert events == ["start 0", "end 0", "update", "start 1", "end 1"]
