"""Asynchronous training's pure parts, without Ray: the sample queue, the staleness filter and
lag statistics, the rollout producer's gate and resume state."""

from __future__ import annotations

import threading
import time

import pytest
from async_fakes import batch, traj

from rl_runtime.asynchrony.producer import RolloutProducer
from rl_runtime.asynchrony.queue import (
    AsyncTimeoutError,
    PendingBatch,
    QueueClosed,
    RolloutBatch,
    SampleQueue,
)
from rl_runtime.asynchrony.staleness import LagStats, StalenessError, filter_stale


# ----------------------------------------------------------------------------------- queue
def test_queue_counts_samples_and_reservations():
    q = SampleQueue(8)
    q.reserve(4, 1.0)
    q.reserve(4, 1.0)
    with pytest.raises(AsyncTimeoutError, match="queue room"):
        q.reserve(1, 0.05)  # 4 + 4 reserved: full although nothing is queued yet
    q.put(batch(0, 3), reserved=4)  # a smaller batch frees the rest of its reservation
    assert q.depth == 3 and len(q) == 1
    q.reserve(1, 0.05)
    assert q.take(1.0).index == 0 and q.depth == 0


def test_queue_refuses_a_batch_larger_than_it_and_one_over_its_reservation():
    q = SampleQueue(4)
    with pytest.raises(ValueError, match="can never fit"):
        q.reserve(5, 1.0)
    q.reserve(2, 1.0)
    with pytest.raises(ValueError, match="reserved room for 2"):
        q.put(batch(0, 3), reserved=2)


def test_take_times_out_with_a_clear_error_and_close_hands_over_the_producer_error():
    q = SampleQueue(4)
    with pytest.raises(AsyncTimeoutError, match="rollout batch 7"):
        q.take(0.05, "rollout batch 7")
    q.reserve(2, 1.0)
    q.put(batch(0, 2), 2)
    q.close(RuntimeError("engine died"))
    assert q.take(1.0).index == 0  # what was queued before the close is still handed out
    with pytest.raises(QueueClosed, match="engine died"):
        q.take(1.0)


def test_a_waiting_take_wakes_on_put():
    q = SampleQueue(4)
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(q.take(5.0).index))
    t.start()
    time.sleep(0.05)
    q.reserve(2, 1.0)
    q.put(batch(3, 2), 2)
    t.join(5.0)
    assert got == [3]


# ------------------------------------------------------------------------------- staleness
def test_filter_keeps_samples_within_the_bound_and_drops_whole_groups():
    samples = [traj("a", 5, k=0), traj("a", 4, k=1), traj("b", 3), traj("c", 5)]
    out = filter_stale(samples, trainer_version=5, max_staleness=1)
    assert [t.traj_id for t in out.kept] == ["a-0", "a-1", "c-0"]
    assert out.dropped == 1 and out.lags == [0, 1, 0]
    # a group is as old as its oldest member: one stale sample drops its group
    out = filter_stale([traj("a", 5, k=0), traj("a", 3, k=1)], 5, 1)
    assert out.kept == [] and out.dropped == 2


def test_staleness_is_measured_from_the_oldest_token_version():
    # partial rollout: started under version 2, finished under 4 -> lag from 2
    sample = traj("a", 4, token_versions=[0, 2, 4])
    assert filter_stale([sample], 4, 1).dropped == 1
    assert filter_stale([sample], 4, 2).lags == [2]


def test_zero_staleness_keeps_only_samples_of_the_current_version():
    out = filter_stale([traj("a", 7), traj("b", 6)], 7, 0)
    assert [t.group_id for t in out.kept] == ["a"] and out.dropped == 1


def test_a_sample_newer_than_the_trainer_is_an_error():
    with pytest.raises(StalenessError, match="newer than the trainer's 3"):
        filter_stale([traj("a", 4)], 3, 2)


def test_lag_statistics():
    stats = LagStats(2)
    kept = filter_stale([traj("a", 5), traj("b", 4), traj("c", 4), traj("d", 1)], 5, 2)
    m = stats.metrics(kept, trained=2)  # learn screened one of the 3 kept out
    assert m["async/lag_mean"] == pytest.approx(2 / 3) and m["async/lag_max"] == 1
    assert [m[f"async/lag_hist/{k}"] for k in range(3)] == [1, 2, 0]
    assert m["async/dropped_stale_samples"] == 1 and m["async/dropped_stale_total"] == 1
    assert m["async/trained_samples_total"] == 2
    stats.metrics(filter_stale([traj("e", 0)], 5, 2), trained=0)
    assert stats.state() == {"total_trained": 2, "total_dropped": 2}
    with pytest.raises(ValueError, match="trained=4 samples, but the staleness bound kept 3"):
        stats.metrics(kept, trained=4)
    stats.load_state({"total_kept": 7, "total_dropped": 1})  # a checkpoint of before
    assert stats.state() == {"total_trained": 7, "total_dropped": 1}


# -------------------------------------------------------------------------------- producer
class Recorder:
    """produce(index): records the trainer's progress seen when each batch starts."""

    def __init__(self) -> None:
        self.trainer_done = 0
        self.seen: list[tuple[int, int]] = []
        self.position = 0

    def produce(self, index: int) -> RolloutBatch:
        self.seen.append((index, self.trainer_done))
        self.position += 1
        return RolloutBatch(index, [traj(f"g{index}", self.trainer_done)])


def run_trainer(max_staleness: int, steps: int, capacity: int = 10) -> Recorder:
    rec = Recorder()
    q = SampleQueue(capacity)
    producer = RolloutProducer(
        rec.produce, q, max_staleness=max_staleness, samples_per_batch=1, start_index=0,
        stop_index=steps, timeout_s=5.0, rollout_state=lambda: {"position": rec.position},
    )  # fmt: skip
    producer.start()
    try:
        for step in range(steps):
            b = q.take(5.0)
            assert b.index == step
            time.sleep(0.02)  # "training": rollout may run ahead meanwhile
            rec.trainer_done = step + 1
            producer.trainer_finished(step + 1)
    finally:
        producer.stop(5.0)
    return rec


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_producer_starts_a_batch_only_within_the_staleness_bound(staleness):
    rec = run_trainer(staleness, steps=6)
    assert [i for i, _ in rec.seen] == list(range(6))
    for index, done in rec.seen:
        assert index - done <= staleness  # batch `index` starts after step index - S finished
    if staleness == 0:  # synchronous: each batch after the previous step finished
        assert rec.seen == [(i, i) for i in range(6)]
    else:  # it did run ahead
        assert any(index - done == staleness for index, done in rec.seen)


def test_queue_capacity_bounds_how_far_rollout_runs_ahead():
    rec = Recorder()
    q = SampleQueue(2)
    producer = RolloutProducer(rec.produce, q, max_staleness=10, samples_per_batch=1,
                               start_index=0, stop_index=10, timeout_s=5.0)  # fmt: skip
    producer.start()
    time.sleep(0.3)
    assert len(rec.seen) == 2 and q.depth == 2  # the trainer has taken nothing: queue full
    producer.stop(5.0)
    assert not producer.alive


def test_producer_error_reaches_the_trainer():
    def produce(index: int) -> RolloutBatch:
        raise RuntimeError("actor_infer.generate failed remotely")

    q = SampleQueue(4)
    producer = RolloutProducer(produce, q, max_staleness=1, samples_per_batch=1, start_index=0,
                               stop_index=3, timeout_s=5.0)  # fmt: skip
    producer.start()
    with pytest.raises(QueueClosed, match="generate failed remotely"):
        q.take(5.0)
    producer.stop(5.0)


def test_resume_state_is_the_rollout_state_before_the_first_unconsumed_batch():
    rec = Recorder()
    q = SampleQueue(10)
    producer = RolloutProducer(rec.produce, q, max_staleness=3, samples_per_batch=1,
                               start_index=0, stop_index=5, timeout_s=5.0,
                               rollout_state=lambda: {"position": rec.position})  # fmt: skip
    producer.start()
    deadline = time.monotonic() + 5
    while len(rec.seen) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(rec.seen) == 4  # ran 3 batches ahead of a trainer that consumed nothing
    q.take(1.0)
    producer.trainer_finished(1)
    # a checkpoint now resumes at batch 1: the sampler as it was before batch 1, not batch 4
    assert producer.resume_state(1) == {"position": 1}
    producer.stop(5.0)


def test_a_producer_without_rollout_state_checkpoints_while_running_ahead():
    """A recipe whose batches are a function of their index (no `rollout_state`, the agentic
    recipe's) has nothing to record: a checkpoint while rollout runs ahead holds None. Before,
    it raised "no rollout state recorded for batch 1", so every mid-run checkpoint of an
    asynchronous agentic run failed."""
    rec = Recorder()
    q = SampleQueue(10)
    producer = RolloutProducer(rec.produce, q, max_staleness=3, samples_per_batch=1,
                               start_index=0, stop_index=5, timeout_s=5.0)  # fmt: skip
    producer.start()
    deadline = time.monotonic() + 5
    while len(rec.seen) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    q.take(1.0)
    producer.trainer_finished(1)
    assert producer.resume_state(1) is None
    producer.stop(5.0)


# ------------------------------------------------------------------ pending (scored later)
def test_a_pending_batch_is_finished_while_the_next_one_generates_and_queued_in_order():
    """`produce` returns batch i pending (generated, not scored); the producer finishes it on
    its finisher thread while batch i + 1 generates: finishing 0 waits for batch 1 to have
    started (it would time out if the two ran one after the other), batch 1 finishes first
    (0 is slow), and the queue still holds them in order."""
    events: list[str] = []
    started = {i: threading.Event() for i in range(3)}

    def produce(index: int) -> PendingBatch:
        started[index].set()
        events.append(f"generate {index}")

        def finish() -> RolloutBatch:
            if index == 0:
                assert started[1].wait(5.0), "batch 1 did not generate while 0 was scored"
            events.append(f"finish {index}")
            return RolloutBatch(index, [traj(f"g{index}", 0)])

        return PendingBatch(index, finish)

    q = SampleQueue(10)
    producer = RolloutProducer(produce, q, max_staleness=2, samples_per_batch=1, start_index=0,
                               stop_index=3, timeout_s=5.0)  # fmt: skip
    producer.start()
    assert [q.take(5.0).index for _ in range(3)] == [0, 1, 2]
    producer.stop(5.0)
    assert not producer.alive and producer.error is None
    assert events.index("generate 1") < events.index("finish 0")
    assert q.depth == 0


def test_an_error_while_finishing_reaches_the_trainer_and_stops_rollout():
    generated: list[int] = []

    def produce(index: int) -> PendingBatch:
        generated.append(index)

        def finish() -> RolloutBatch:
            if index == 1:
                raise RuntimeError("sandbox scorer died")
            return RolloutBatch(index, [traj(f"g{index}", 0)])

        return PendingBatch(index, finish)

    q = SampleQueue(10)
    producer = RolloutProducer(produce, q, max_staleness=5, samples_per_batch=1, start_index=0,
                               stop_index=50, timeout_s=5.0)  # fmt: skip
    producer.start()
    assert q.take(5.0).index == 0
    with pytest.raises(QueueClosed) as err:
        q.take(5.0)
    assert "sandbox scorer died" in repr(err.value.__cause__)
    producer.stop(5.0)
    assert not producer.alive and len(generated) < 50  # rollout stopped with it
