"""A default run listens on loopback only: the embedded Ray cluster, the TrainWorkers' default
process group (gloo's pairs; its store is a node-local file, no listener) and rl-sync's
weight-sync store. Checked by reading the kernel's
socket table for this process and its descendants (`rl_runtime.cluster.listeners`)."""

import os
import socket
import sys

import pytest

from rl_runtime.cluster.listeners import exposed, listening_sockets

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _mine(port: int) -> list:
    return [x for x in listening_sockets() if x.port == port]


def test_listeners_see_loopback_and_wildcard_binds():
    with socket.socket() as lo, socket.socket(socket.AF_INET6) as anywhere:
        lo.bind(("127.0.0.1", 0))
        lo.listen()
        anywhere.bind(("::", 0))
        anywhere.listen()
        (own,) = _mine(lo.getsockname()[1])
        (wild,) = _mine(anywhere.getsockname()[1])
    assert (own.host, own.loopback, own.pid) == ("127.0.0.1", True, os.getpid())
    assert (wild.host, wild.loopback) == ("::", False)
    assert exposed([own, wild]) == [wild]


def test_sync_group_store_listens_on_loopback_only():
    from rl_sync.group import init_group

    group = init_group("127.0.0.1", 0, 0, 1, timeout_s=30)
    try:
        store = _mine(group.port)
        assert store and not exposed(store), store
        assert not exposed(listening_sockets()), listening_sockets()
    finally:
        group.close()


def test_non_loopback_store_host_is_left_to_torch():
    """A cluster address is where remote peers connect: its store keeps torch's own bind."""
    from rl_sync.store import create_store, is_loopback_host

    assert is_loopback_host("127.0.0.2") and is_loopback_host("::1")
    assert is_loopback_host("localhost") and not is_loopback_host("10.0.0.1")
    assert not is_loopback_host("0.0.0.0") and not is_loopback_host("::")
    store = create_store("127.0.0.1", 0, 1, True, 30)
    assert _mine(int(store.port))[0].host == "127.0.0.1"


@pytest.mark.slow  # Ray start + one TrainWorker on a tiny model (~30 s idle)
@pytest.mark.xdist_group("ray")
def test_default_ray_run_listens_on_loopback_only(tmp_path):
    from rl_rollout.tiny_model import build_tiny_model
    from rl_runtime.cluster.cluster import Cluster, RoleSpec
    from rl_runtime.cluster.ray_setup import RayOptions
    from rl_runtime.cluster.workers import TrainWorker

    model = str(build_tiny_model(tmp_path / "tiny"))
    spec = RoleSpec(
        "actor_train",
        TrainWorker,
        [0],
        dict(
            role="actor",
            model_path=model,
            strategy_name="hf_infer",
            training_args=dict(per_device_train_batch_size=1, learning_rate=1e-3),
        ),
    )
    cluster = Cluster.start(
        [spec], num_devices=1, ray_options=RayOptions(num_cpus=1), rpc_timeout=300.0
    )
    try:
        train = cluster["actor_train"]
        # the weight-sync store as WeightSync.setup hosts it (a world of one: no engines here)
        port = train.call_rank0("open_sync_listener", "127.0.0.1")
        assert train.call_all("init_sync_group", "127.0.0.1", port, 1, 60.0) == [True]
        listeners = listening_sockets()
        names = {x.name for x in listeners}
        assert {"gcs_server", "raylet"} <= names, listeners
        assert len({x.pid for x in listeners}) >= 4, listeners  # driver, gcs, raylet, worker
        assert exposed(listeners) == [], exposed(listeners)
    finally:
        cluster.shutdown()


def test_joining_a_cluster_uses_its_addresses_and_embedded_binds_loopback():
    from rl_runtime.cluster.ray_setup import RayOptions, ray_init_kwargs

    joined = ray_init_kwargs(RayOptions(), "10.1.2.3:6379")
    assert joined["address"] == "10.1.2.3:6379"
    assert not {"_node_ip_address", "num_cpus", "include_dashboard"} & set(joined)
    embedded = ray_init_kwargs(RayOptions(num_cpus=1), None)
    assert embedded["_node_ip_address"] == "127.0.0.1"
    assert embedded["address"] == "local"  # never an unrelated `ray start` cluster on this host
    assert embedded["include_dashboard"] is False and "dashboard_host" not in embedded
    shown = ray_init_kwargs(RayOptions(include_dashboard=True), None)
    assert shown["dashboard_host"] == "127.0.0.1"
