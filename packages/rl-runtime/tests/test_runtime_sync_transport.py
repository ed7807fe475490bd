"""The weight sync's transport: shared memory where every engine shares the CPU trainer's node
(rl_runtime.cluster.sync_transport), broadcast otherwise; and a real Ray run of each, the engine holding
exactly the trainer's weights after every sync."""

from __future__ import annotations

import glob
import os
from types import SimpleNamespace

import pytest

from rl_config.errors import ConfigError
from rl_runtime.cluster.sync_transport import SHM_HEADROOM, choose_sync_transport, staging_room

MB = 2**20


def _choose(requested="auto", *, cross_node=False, device="cpu", weights=16 * MB, free=64 * MB):
    return choose_sync_transport(
        requested,
        cross_node=cross_node,
        trainer_device=device,
        weight_bytes=weights,
        shm_free_bytes=free,
    )


def test_auto_takes_shared_memory_on_one_cpu_node_with_room():
    assert _choose().transport == "shared_memory"
    # exactly the headroom is enough, a byte less is not
    assert _choose(free=int(16 * MB * SHM_HEADROOM)).transport == "shared_memory"
    assert _choose(free=int(16 * MB * SHM_HEADROOM) - 1).transport == "broadcast"


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ({"cross_node": True}, "another node"),
        ({"device": "cuda"}, "live on cuda"),
        ({"device": "npu"}, "live on npu"),
        ({"free": 20 * MB}, "has 20 MiB free, the weights need 24 MiB"),  # a container's /dev/shm
        ({"weights": None}, "unknown"),
    ],
)
def test_auto_falls_back_to_broadcast_and_shared_memory_is_refused_by_name(case, why):
    chosen = _choose(**case)
    assert chosen.transport == "broadcast" and why in chosen.reason
    with pytest.raises(ConfigError) as err:
        _choose("shared_memory", **case)
    assert err.value.issues[0].path == "weight_sync_transport"
    assert why in err.value.issues[0].message


def test_staging_needs_room_for_two_more_buffers():
    """Staged delivery (asynchronous training without partial rollout) keeps two buffers beside
    the transport's own: /dev/shm must hold the weights SHM_HEADROOM + 2 times."""
    need = int(16 * MB * (SHM_HEADROOM + 2))
    assert staging_room(16 * MB, need) and not staging_room(16 * MB, need - 1)
    assert not staging_room(None, need) and not staging_room(16 * MB, None)


def test_broadcast_when_asked_even_where_shared_memory_would_work():
    assert _choose("broadcast").transport == "broadcast"
    assert _choose("shared_memory").transport == "shared_memory"
    with pytest.raises(ValueError, match="unknown weight_sync_transport"):
        _choose("nccl")


def test_the_key_reaches_the_cluster_settings_and_warns_without_ray():
    from rl_config.schema import ExperimentConfig
    from rl_runtime.compose.run_settings import build_cluster
    from rl_runtime.run.runner import check_in_process

    base = {"pretrain": "/tmp/model"}
    cfg = ExperimentConfig.model_validate({**base, "weight_sync_transport": "broadcast"})
    settings = build_cluster(cfg, sync_bucket_bytes=1 << 20)
    assert settings.sync_transport == "broadcast"
    default = ExperimentConfig.model_validate(base)
    assert build_cluster(default, sync_bucket_bytes=1).sync_transport == "auto"
    with pytest.raises(ConfigError, match="weight_sync_transport"):
        ExperimentConfig.model_validate({**base, "weight_sync_transport": "ipc"})
    components = SimpleNamespace(roles=[], asynchronous=None, cluster=settings)
    warnings = check_in_process(components, use_ray=False)  # type: ignore[arg-type]
    assert any(w.startswith("weight_sync_transport='broadcast' has no effect") for w in warnings)


def _buffers_of(pids: set[int]) -> list[str]:
    from rl_sync.ipc import shm_dir

    return [
        p
        for p in glob.glob(os.path.join(shm_dir(), "rl_sync_*.buf"))
        if int(os.path.basename(p).split("_")[2]) in pids
    ]


@pytest.mark.slow  # Ray start, a trainer and an engine on a tiny model (~40 s each)
@pytest.mark.xdist_group("ray")
@pytest.mark.parametrize(
    ("requested", "strategy", "ranks"),
    [("auto", "hf_infer", 1), ("broadcast", "hf_infer", 1), ("auto", "fsdp2_train", 2)],
)
def test_a_ray_sync_carries_the_trainers_exact_weights(requested, strategy, ranks, tmp_path):
    """Three syncs (each after a training step but the first, into the same shared buffer; the
    third deferred, then settled): the engine holds the trainer's weights bit for bit each time; `sync/shared_memory` says which transport
    carried them; the shared buffer is gone after shutdown. With two FSDP2 ranks the full
    tensors are gathered collectively (measuring them at setup too) and rank 0 shares them."""
    import ray
    import torch

    from rl_rollout.tiny_model import build_tiny_model
    from rl_runtime.cluster.cluster import Cluster, RoleSpec, WeightSync
    from rl_runtime.cluster.ray_setup import RayOptions
    from rl_runtime.cluster.workers import RolloutWorker, TrainWorker
    from rl_runtime.step.collate import shard_rows
    from rl_train.testing import make_batch

    model = str(build_tiny_model(tmp_path / "tiny", seed=0))
    train_kwargs = dict(
        role="actor",
        model_path=model,
        strategy_name=strategy,
        training_args=dict(per_device_train_batch_size=4 // ranks, learning_rate=1e-2),
    )
    specs = [
        RoleSpec("actor_train", TrainWorker, list(range(ranks)), train_kwargs),
        RoleSpec(
            "actor_infer", RolloutWorker, [ranks], dict(model_path=model, strategy_name="hf_infer")
        ),
    ]
    cluster = Cluster.start(
        specs,
        num_devices=ranks + 1,
        ray_options=RayOptions(num_cpus=ranks + 1),
        rpc_timeout=300.0,
    )
    train, infer = cluster["actor_train"], cluster["actor_infer"]
    try:
        actor = train.workers[0]
        trainer_pid = int(ray.get(actor.__ray_call__.remote(lambda _self: os.getpid())))
        sync = WeightSync(train, infer, mode="broadcast", timeout_s=120, transport=requested)
        shared = requested == "auto"
        before = infer.call_rank0("state_dict_for_check")
        for version in (1, 2, 3):
            if version > 1:
                batch = make_batch(4, 12, vocab=1000)
                shards = shard_rows(batch, ranks)
                train.wait(train.submit_each("train_step", [(b, "sft") for b in shards]), "step")
            if version < 3:
                metrics = sync.sync(version)
                assert metrics["sync/bytes"] > 0
            else:  # deferred (asynchronous training with partial rollout): exact once settled
                metrics = sync.sync(version, settle=False)
                assert metrics["sync/deferred"] == 1.0 and sync.settle()["sync/bytes"] > 0
            assert metrics["sync/shared_memory"] == float(shared)
            assert metrics["sync/weight_version"] == version
            trainer = train.call_all("state_dict_for_check")[0]  # collective
            engine = infer.call_rank0("state_dict_for_check")
            assert trainer.keys() <= engine.keys()
            assert all(torch.equal(trainer[k], engine[k]) for k in trainer)
        assert any(not torch.equal(before[k], engine[k]) for k in trainer)  # the step moved them
        assert sync.transport is not None and sync.transport.transport == (
            "shared_memory" if shared else "broadcast"
        )
        # the trainer's shared buffer, while it runs (broadcast makes none)
        assert len(_buffers_of({trainer_pid})) == int(shared)
        if shared:  # staged: two alternating buffers, a handle valid while the next is packed
            assert sync.can_stage()
            delivers = []
            for version in (4, 5):
                batch = make_batch(4, 12, vocab=1000)
                shards = shard_rows(batch, ranks)
                train.wait(train.submit_each("train_step", [(b, "sft") for b in shards]), "step")
                delivers.append(sync.stage(version)[0])
            assert len(_buffers_of({trainer_pid})) == 3
            delivers[0]()  # version 4's buffer was not touched by version 5's export
            assert infer.call_rank0("weight_version") == 4
            delivers[1]()
            trainer = train.call_all("state_dict_for_check")[0]
            engine = infer.call_rank0("state_dict_for_check")
            assert all(torch.equal(trainer[k], engine[k]) for k in trainer)
    finally:
        cluster.shutdown()
    assert _buffers_of({trainer_pid}) == []  # removed at shutdown
