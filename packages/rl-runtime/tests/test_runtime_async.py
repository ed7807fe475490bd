"""Asynchronous training's pure parts, without Ray: the sample queue, the staleness filter and
lag statistics, the rollout producer's gate, and the async plan compose builds."""

from __future__ import annotations

import threading
import time

import pytest

from rl_config.records import Trajectory
from rl_runtime.asynchrony.producer import RolloutProducer
from rl_runtime.asynchrony.queue import (
    AsyncTimeoutError,
    PendingBatch,
    QueueClosed,
    RolloutBatch,
    SampleQueue,
)
from rl_runtime.asynchrony.staleness import LagStats, StalenessError, filter_stale
from rl_runtime.run.recipe import Recipe


def traj(group: str, version: int, token_versions: list[int] | None = None, k: int = 0):
    return Trajectory(
        traj_id=f"{group}-{k}", group_id=group, tag="t", env_seed=0, token_ids=[1, 2, 3],
        prompt_length=1, response_mask=[False, True, True], rollout_log_probs=[0.0, -1.0, -1.0],
        weight_version=version, token_versions=token_versions or [],
    )  # fmt: skip


def batch(index: int, n: int) -> RolloutBatch:
    return RolloutBatch(index, [traj(f"g{index}", index, k=k) for k in range(n)])


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


def test_partial_rollout_reaches_the_plan():
    on = _compose(_cfg(**{"async": {"max_staleness": 1, "partial_rollout": True}})).asynchronous
    off = _compose(_cfg(**{"async": {"max_staleness": 1}})).asynchronous
    assert on is not None and on.partial_rollout
    assert off is not None and not off.partial_rollout


def _cfg(**extra):
    from rl_config.schema import ExperimentConfig

    base = {
        "pretrain": "m", "num_gpus_per_node": 2, "rollout_batch_size": 4,
        "num_return_sequences_in_group": 2,
        "actor_train": {"device_mapping": [0]}, "actor_infer": {"device_mapping": [1]},
        "reference": {"device_mapping": [0]},
    }  # fmt: skip
    base.update(extra)
    return ExperimentConfig.model_validate(base)


def _compose(cfg):
    from rl_runtime.compose import compose

    return compose(cfg, pipeline="rlvr")


def test_synchronous_by_default_and_with_max_staleness_zero():
    assert _compose(_cfg()).asynchronous is None
    c = _compose(_cfg(**{"async": {"max_staleness": 0, "queue_size": 16}}))
    assert c.asynchronous is None
    assert any("async.queue_size=16 has no effect" in w for w in c.warnings)


def test_roll_async_generation_ratio_maps_onto_max_staleness():
    plan = _compose(_cfg(async_generation_ratio=1.5)).asynchronous
    assert plan is not None and plan.max_staleness == 2
    assert plan.queue_samples == 2 * 8  # samples_per_step (4 prompts x 2) x max_staleness
    assert plan.source == "async_generation_ratio=1.5 -> max_staleness=2"
    one_step_off = _compose(_cfg(**{"async": {"max_staleness": 1}})).asynchronous
    assert one_step_off is not None and one_step_off.max_staleness == 1
    assert one_step_off.source == "async.max_staleness=1"


def test_a_queue_smaller_than_a_batch_is_refused_by_name():
    with pytest.raises(ValueError, match="async.queue_size=5 is smaller than one step's batch"):
        _compose(_cfg(**{"async": {"max_staleness": 1, "queue_size": 5}}))


def test_async_without_is_correction_warns_and_with_it_does_not():
    c = _compose(_cfg(**{"async": {"max_staleness": 1}}))
    assert any("without train_infer_correction" in w for w in c.warnings)
    tic = {"is_weight": {"enabled": True, "upper_bound": 2.0}}
    c = _compose(_cfg(**{"async": {"max_staleness": 1}, "train_infer_correction": tic}))
    assert not any("train_infer_correction" in w for w in c.warnings)
    assert c.role("actor_train").loss.is_weight is not None  # the loss corrects against rollout


def test_a_role_colocated_with_the_engines_is_refused_for_async():
    with pytest.raises(ValueError, match="reference.device_mapping shares devices \\[1\\]"):
        _compose(_cfg(**{"async": {"max_staleness": 1}, "reference": {"device_mapping": [1]}}))


@pytest.mark.parametrize(
    "section, match",
    [
        ({"max_staleness": 1, "max_inflight_samples": 4}, "one step's batch at a time"),
    ],
)
def test_unimplemented_async_keys_are_refused_by_name(section, match):
    from rl_config.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        _compose(_cfg(**{"async": section}))


# ---------------------------------------------------------------------------- async runner
class FakeCluster:
    def __init__(self, colocated: list[str]) -> None:
        self.colocated = colocated

    def colocated_with_infer(self) -> list[str]:
        return self.colocated


class SplitRecipe(Recipe):
    def rollout(self, ctx, index):
        return RolloutBatch(index, [])

    def learn(self, ctx, batch):
        return {}


def _training(recipe, colocated=(), samples_per_batch=2):
    from types import SimpleNamespace

    from rl_runtime.asynchrony.training import AsyncTraining
    from rl_runtime.compose import AsyncPlan

    plan = AsyncPlan(max_staleness=1, queue_samples=2 * samples_per_batch, wait_timeout_s=5.0,
                     source="test")  # fmt: skip
    ctx = SimpleNamespace(cluster=FakeCluster(list(colocated)))
    return AsyncTraining(
        plan, recipe, ctx, samples_per_batch=samples_per_batch, start_index=0, stop_index=2
    )


def test_async_training_refuses_colocated_engines_and_unsplit_recipes():
    with pytest.raises(RuntimeError, match=r"\['reference'\] sharing devices with actor_infer"):
        _training(SplitRecipe(), colocated=["reference"])
    with pytest.raises(TypeError, match="no `rollout`"):
        _training(object())
    _training(SplitRecipe())


def test_a_checkpoint_whose_async_bookkeeping_disagrees_is_refused():
    from rl_runtime.asynchrony.training import restore_rollout_state

    loaded: list[dict] = []

    class Recipe:
        def load_rollout_state(self, state):
            loaded.append(state)

    good = {"trainer_version": 5, "next_index": 4, "rollout_state": {"sampler": 1}}
    restore_rollout_state(Recipe(), good, step=4, weight_version=5)
    assert loaded == [{"sampler": 1}]
    with pytest.raises(RuntimeError, match="disagrees with its run state"):
        restore_rollout_state(Recipe(), {**good, "trainer_version": 0}, step=4, weight_version=5)


def test_trainer_progress_never_goes_back():
    """Deferred weight syncs report their ends from watcher threads, possibly out of order: a
    late report of an earlier step must not close the gate again."""
    producer = RolloutProducer(
        lambda index: RolloutBatch(index, []), SampleQueue(10), max_staleness=0,
        samples_per_batch=1, start_index=0, stop_index=5, timeout_s=5.0,
    )  # fmt: skip
    producer.trainer_finished(3)
    producer.trainer_finished(2)
    assert producer._gate_open(3) and not producer._gate_open(4)


class ScreeningRecipe(Recipe):
    """Batches of 4 samples of one group, the sample `k == 1` of each one whose reward call
    failed; `learn` is the recipes' own path up to train_step: failed episodes screened out
    (rl_runtime.step.failures), the rest collated, `rollout_metrics` of what is trained."""

    def rollout(self, ctx, index):
        from rl_config.records import Turn

        samples = [traj(f"g{index}", version=index, k=k) for k in range(4)]
        for t in samples:
            failed = t.traj_id.endswith("-1")
            t.turns = [Turn(turn_idx=0, start=1, end=3, info={"reward_failed": failed})]
        return RolloutBatch(index, samples)

    def learn(self, ctx, batch):
        from rl_runtime.step.collate import collate_trajectories
        from rl_runtime.step.failures import screen_failures
        from rl_runtime.step.metrics import rollout_metrics

        screened = screen_failures(batch.trajectories, max_failed_fraction=0.5)
        collated = collate_trajectories(screened.kept, pad_token_id=0)
        self.trained = getattr(self, "trained", 0) + collated.batch_size  # train_step's rows
        return {**screened.metrics, **rollout_metrics(screened.kept, collated)}


def test_trained_samples_total_counts_what_reached_train_step_not_failed_samples():
    """`async/trained_samples_total` adds up the samples train_step got: a batch's failed
    episodes, which learn screens out, are not trained on. Before, it counted every sample the
    staleness bound kept (8 after two steps here, not 6)."""
    from types import SimpleNamespace

    recipe = ScreeningRecipe()
    training = _training(recipe, samples_per_batch=4)
    ctx = SimpleNamespace(cluster=FakeCluster([]), step=0, weight_version=0)
    training.start()
    try:
        rows = []
        for step in range(2):
            ctx.step = ctx.weight_version = step
            rows.append(training.step(ctx))
            training.trainer_finished(step + 1)
    finally:
        training.stop()
    assert [r["failures/reward_failures"] for r in rows] == [1.0, 1.0]
    assert [r["rollout/num_trajectories"] for r in rows] == [3.0, 3.0]
    assert [r["async/trained_samples_total"] for r in rows] == [3.0, 6.0] and recipe.trained == 6
    assert [r["async/lag_hist/0"] for r in rows] == [4.0, 4.0]  # lags: all the bound kept


def test_a_learn_that_does_not_say_what_it_trained_on_is_an_error():
    from types import SimpleNamespace

    class Silent(ScreeningRecipe):
        def learn(self, ctx, batch):
            return {"train/loss": 0.0}

    training = _training(Silent(), samples_per_batch=4)
    training.start()
    try:
        with pytest.raises(RuntimeError, match="Silent.learn reported neither rollout/num_traj"):
            training.step(SimpleNamespace(step=0, weight_version=0))
    finally:
        training.stop()
