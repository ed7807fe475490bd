"""WeightSync's address: the sync group meets on the trainer's node (and the transport follows
the layout: rl_runtime.cluster.sync_transport).

The decision is tested here with workers that report a given node and record the rendezvous they
are asked to join (local workers run one call at a time, so a real group cannot form between
them); the real cross-node sync over Ray runs in tests/test_two_ray_nodes.py (slow)."""

from __future__ import annotations

import pytest

from rl_runtime.cluster.cluster import WeightSync
from rl_runtime.cluster.placement import plan_placement
from rl_runtime.cluster.sync_address import LOOPBACK, NodeAddress, choose_sync_host
from rl_runtime.cluster.worker_group import WorkerGroup


def test_choose_sync_host():
    trainer = NodeAddress("n1", "10.0.0.5")
    same = [NodeAddress("n1", "10.0.0.5")] * 2
    other = [*same, NodeAddress("n2", "10.0.0.6")]
    assert choose_sync_host(trainer, same) == LOOPBACK  # one node: loopback only
    assert choose_sync_host(trainer, other) == "10.0.0.5"  # the trainer node's address
    assert choose_sync_host(trainer, other, "trainer.example") == "trainer.example"
    assert choose_sync_host(trainer, same, "10.0.0.5") == "10.0.0.5"


class _Recorder:
    """Reports a node, binds a port like TrainWorker.open_sync_listener, records
    init_sync_group calls."""

    def __init__(self, *, rank, world_size, dist_env, nodes) -> None:
        self.rank, self.node, self.joined = rank, nodes[rank], []

    def node_address(self) -> tuple[str, str]:
        return self.node

    def open_sync_listener(self, host: str) -> int:
        from rl_sync.store import bind_listener

        self.listener = bind_listener(host, 0)
        return int(self.listener.getsockname()[1])

    def init_sync_group(self, host, port, world_size, timeout_s) -> bool:
        self.joined.append((host, port, world_size))
        return True

    def joined_groups(self) -> list:
        return self.joined

    def sync_info(self, measure: bool, bucket_bytes: int) -> dict:
        self.measured = measure
        return {"device": "cpu", **({"weight_bytes": 1, "shm_free_bytes": 2} if measure else {})}

    def was_measured(self) -> bool:
        return self.measured


@pytest.mark.parametrize(
    ("trainer_node", "rollout_nodes", "configured", "host", "cross_node"),
    [
        (("a", "127.0.0.3"), [("b", "127.0.0.1"), ("a", "127.0.0.3")], None, "127.0.0.3", True),
        (("a", "127.0.0.3"), [("a", "127.0.0.3")] * 2, None, LOOPBACK, False),
        (("a", "127.0.0.3"), [("b", "127.0.0.1")] * 2, "127.0.0.4", "127.0.0.4", True),
    ],
)
def test_sync_group_meets_on_the_trainer_node(
    trainer_node, rollout_nodes, configured, host, cross_node
):
    plan = plan_placement({"actor_train": [0], "actor_infer": [1, 2]}, num_devices=3)
    train = WorkerGroup.create(
        "actor_train",
        _Recorder,
        plan.roles["actor_train"],
        mode="local",
        rpc_timeout=30,
        init_kwargs={"nodes": [trainer_node]},
    )
    infer = WorkerGroup.create(
        "actor_infer",
        _Recorder,
        plan.roles["actor_infer"],
        mode="local",
        rpc_timeout=30,
        init_kwargs={"nodes": rollout_nodes},
    )
    try:
        sync = WeightSync(train, infer, mode="broadcast", timeout_s=30, host=configured)
        sync.setup()
        assert sync.host == host and sync.cross_node is cross_node
        # the weights and /dev/shm are measured only where shared memory is possible
        assert train.call_all("was_measured") == [not cross_node]
        assert sync.transport is not None
        assert sync.transport.transport == ("broadcast" if cross_node else "shared_memory")
        joined = [
            g
            for group in (train, infer)
            for calls in group.call_all("joined_groups")
            for g in calls
        ]
        assert len(joined) == 3 and all(g == joined[0] for g in joined)
        assert joined[0][0] == host and joined[0][2] == 3
    finally:
        train.shutdown()
        infer.shutdown()


def test_sync_local_addr_is_this_nodes_address_off_loopback():
    from rl_runtime.cluster.sync_address import node_address, sync_local_addr

    assert sync_local_addr("127.0.0.1") is None  # rl_sync pins gloo to loopback itself
    assert sync_local_addr("10.1.2.3") == node_address().ip  # without Ray: ("local", loopback)


def test_in_process_sync_hands_the_trainers_own_tensors_and_the_engine_keeps_copies(tmp_path):
    """`mode="direct"` (--no-ray): the trainer hands its live tensors, with no host copies; the
    HF engine copies them, so its weights equal the trainer's after the sync and stay the synced
    version's when the trainer steps again."""
    import torch

    from rl_rollout.tiny_model import build_tiny_model
    from rl_runtime.cluster.workers import RolloutWorker, TrainWorker
    from rl_train.args import TrainingArgs
    from rl_train.testing import make_batch

    model = str(build_tiny_model(tmp_path / "tiny", seed=0))
    plan = plan_placement({"actor_train": [0], "actor_infer": [0]}, num_devices=1)
    args = TrainingArgs(per_device_train_batch_size=4, learning_rate=1e-2)
    trainer_kwargs = {"role": "actor", "strategy_name": "hf_infer", "training_args": args}
    train = WorkerGroup.create(
        "actor_train",
        TrainWorker,
        plan.roles["actor_train"],
        mode="local",
        rpc_timeout=60,
        init_kwargs={"model_path": model, **trainer_kwargs},
    )
    infer = WorkerGroup.create(
        "actor_infer",
        RolloutWorker,
        plan.roles["actor_infer"],
        mode="local",
        rpc_timeout=60,
        init_kwargs={"model_path": model, "strategy_name": "hf_infer"},
    )
    try:

        def trainer_weights() -> dict[str, torch.Tensor]:
            return dict(train.call_rank0("named_tensors", 1 << 20))  # host copies

        own = [train.call_rank0("named_tensors", 1 << 20, False) for _ in range(2)]
        assert [t.data_ptr() for _n, t in own[0]] == [t.data_ptr() for _n, t in own[1]]
        assert all(
            t.data_ptr() != c.data_ptr() for (_n, t), c in zip(own[0], trainer_weights().values())
        )

        train.call_rank0("train_step", make_batch(4, 12, vocab=1000), "sft")
        sync = WeightSync(train, infer, mode="direct", timeout_s=60)
        assert sync.sync(1)["sync/weight_version"] == 1.0
        synced = trainer_weights()
        engine = infer.call_all("state_dict_for_check")[0]
        assert engine and all(torch.equal(engine[n], synced[n]) for n in engine)

        train.call_rank0("train_step", make_batch(4, 12, vocab=1000, seed=1), "sft")
        stepped = trainer_weights()
        moved = [n for n in engine if not torch.equal(stepped[n], synced[n])]
        assert moved  # the trainer's step changed its weights ...
        after = infer.call_all("state_dict_for_check")[0]
        assert all(torch.equal(after[n], synced[n]) for n in moved)  # ... and not the engine's
    finally:
        train.shutdown()
        infer.shutdown()


class _Transfer(_Recorder):
    """A sync peer whose transfer calls report a version (the engine's: `reported`, default
    the one sent), recording the versions asked for."""

    def __init__(self, *, rank, world_size, dist_env, nodes, reported=None) -> None:
        super().__init__(rank=rank, world_size=world_size, dist_env=dist_env, nodes=nodes)
        self.reported, self.asked = reported, []

    def send_weights_shared(self, version, bucket_bytes) -> dict:
        self.asked.append(version)
        return {"bytes": 8.0, "version": float(version)}

    def receive_weights_shared(self, version) -> dict:
        self.asked.append(version)
        return {"version": float(version if self.reported is None else self.reported)}

    def versions_asked(self) -> list:
        return self.asked


def _transfer_groups(reported=None):
    plan = plan_placement({"actor_train": [0], "actor_infer": [1]}, num_devices=2)
    node = ("a", "127.0.0.3")
    groups = [
        WorkerGroup.create(
            role,
            _Transfer,
            plan.roles[role],
            mode="local",
            rpc_timeout=30,
            init_kwargs={"nodes": [node], **extra},
        )
        for role, extra in (("actor_train", {}), ("actor_infer", {"reported": reported}))
    ]
    return groups[0], groups[1]


def test_a_deferred_sync_is_checked_when_it_settles():
    """`sync(settle=False)` returns without the engines' verdict; a wrong committed version is
    an error at `settle` (or at the next sync, which settles the one before it first)."""
    from rl_runtime.cluster.cluster import WeightSyncError

    train, infer = _transfer_groups(reported=0)  # the engine reports it kept version 0
    try:
        sync = WeightSync(train, infer, mode="broadcast", timeout_s=30)
        metrics = sync.sync(1, settle=False)
        assert metrics["sync/deferred"] == 1.0 and metrics["sync/weight_version"] == 1.0
        with pytest.raises(WeightSyncError, match="after syncing version 1 .* versions \\[0\\]"):
            sync.settle()
        assert sync.settle() == {}  # nothing left in flight
        sync.sync(2, settle=False)
        with pytest.raises(WeightSyncError, match="version 2"):
            sync.sync(3)  # settles version 2 before sending 3
    finally:
        train.shutdown()
        infer.shutdown()


def test_a_deferred_sync_settles_before_the_next_and_reports_when_committed():
    import threading

    train, infer = _transfer_groups()
    try:
        sync = WeightSync(train, infer, mode="broadcast", timeout_s=30)
        committed = threading.Event()
        sync.when_committed(committed.set)  # nothing in flight: at once
        assert committed.is_set()
        sync.sync(1, settle=False)
        committed.clear()
        sync.when_committed(committed.set)
        assert committed.wait(10)
        second = sync.sync(2)
        assert "sync/deferred" not in second and second["sync/bytes"] == 8.0
        assert infer.call_rank0("versions_asked") == [1, 2]
    finally:
        train.shutdown()
        infer.shutdown()
