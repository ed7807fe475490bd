import time

import pytest

from rl_runtime.cluster.placement import plan_placement
from rl_runtime.cluster.rpc import RemoteCallError, RpcTimeoutError, call
from rl_runtime.cluster.worker_group import WorkerGroup


class Echo:
    def __init__(self, rank, world_size, dist_env, delay=0.0):
        import os

        self.rank = rank
        self.world_size = world_size
        self.env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
        self.dist_env = dist_env
        self.delay = delay

    def whoami(self):
        return (self.rank, self.world_size, self.dist_env["RANK"], self.env)

    def rendezvous(self):
        return dict(self.dist_env)

    def slow(self, seconds):
        time.sleep(seconds)
        return seconds

    def boom(self):
        raise KeyError("missing thing")

    def in_ray_actor(self):
        from rl_runtime.cluster.worker_process import in_ray_actor

        return in_ray_actor()


class SetUpEcho(Echo):
    """A worker that sets its process up as the runtime's workers do."""

    def __init__(self, rank, world_size, dist_env):
        from rl_runtime.cluster.worker_process import _init_process

        _init_process(dist_env, seed=0)
        super().__init__(rank, world_size, dist_env)

    def cwd(self):
        import os

        return os.getcwd()


def test_call_passes_local_values_through():
    assert call(3, timeout=1) == 3
    assert call([1, 2], timeout=1) == [1, 2]
    with pytest.raises(ValueError, match="> 0"):
        call(1, timeout=0)


def test_local_worker_group_runs_in_process():
    plan = plan_placement({"actor_train": [0, 1]}, num_devices=2)
    group = WorkerGroup.create("actor_train", Echo, plan.roles["actor_train"], mode="local")
    out = group.call_all("whoami")
    assert [(r, w, env_rank) for r, w, env_rank, _ in out] == [(0, 2, "0"), (1, 2, "1")]
    assert group.wait(group.submit_each("slow", [(0,), (0,)]), "slow") == [0, 0]
    assert group.call_all("in_ray_actor") == [False, False]  # shutdown destroys their group
    with pytest.raises(ValueError, match="2 workers"):
        group.submit_each("slow", [(0,)])


def test_each_group_meets_in_its_own_node_local_rendezvous_without_a_port():
    """No MASTER_PORT picked by the driver (a port race, EADDRINUSE once in CI): the ranks of a
    role share one fresh token; another group (or a restart) gets another."""
    from rl_train.dist import RENDEZVOUS_ENV

    plan = plan_placement({"actor_train": [0, 1], "reference": [2]}, num_devices=3)
    train = WorkerGroup.create("actor_train", Echo, plan.roles["actor_train"], mode="local")
    ref = WorkerGroup.create("reference", Echo, plan.roles["reference"], mode="local")
    envs = train.call_all("rendezvous")
    assert all("MASTER_PORT" not in e and "MASTER_ADDR" not in e for e in envs), envs
    tokens = {e[RENDEZVOUS_ENV] for e in envs}
    assert tokens == {train.rendezvous_token}
    assert ref.call_all("rendezvous")[0][RENDEZVOUS_ENV] not in tokens


def test_a_group_start_sweeps_the_store_file_a_killed_driver_left(tmp_path, monkeypatch):
    """A driver SIGKILLed before its teardown leaves its role's rendezvous file; the next
    group started on this node removes it (rl_sync.store.sweep_leaked_rendezvous)."""
    import tempfile

    from rl_sync.testing import killed_launchers_store

    leaked = killed_launchers_store(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    plan = plan_placement({"actor_train": [0, 1]}, num_devices=2)
    group = WorkerGroup.create("actor_train", Echo, plan.roles["actor_train"], mode="local")
    assert not (tmp_path / leaked).exists()
    group.shutdown()


class Stuck:
    """A worker whose `hang` blocks (bounded by `release`, so the old code returns late)."""

    def __init__(self, rank, world_size, dist_env, fail=False):
        import threading

        if fail:
            raise OSError("no such model")
        self.release = threading.Event()

    def hang(self, seconds):
        self.release.wait(seconds)
        return "late"

    def boom(self):
        raise KeyError("missing thing")

    def free(self):
        self.release.set()


def test_local_worker_group_calls_are_bounded_by_rpc_timeout():
    """--no-ray: a hanging call raises RpcTimeoutError after rpc_timeout, naming role and method;
    a worker's own exception (constructor or method) reaches the driver unchanged."""
    plan = plan_placement({"actor_infer": [0]}, num_devices=1)
    group = WorkerGroup.create(
        "actor_infer", Stuck, plan.roles["actor_infer"], mode="local", rpc_timeout=1.0
    )
    worker = group.workers[0]
    start = time.monotonic()
    with pytest.raises(RpcTimeoutError, match=r"actor_infer\.hang did not answer within 1 s"):
        group.call_all("hang", 20.0)
    assert time.monotonic() - start < 10.0
    worker._obj.free()  # let the stuck thread go (it is a daemon: it would not hold the exit)
    group.shutdown()
    ok = WorkerGroup.create("actor_train", Stuck, plan.roles["actor_infer"], mode="local")
    with pytest.raises(KeyError, match="missing thing"):
        ok.call_all("boom")
    ok.shutdown()
    with pytest.raises(OSError, match="no such model"):
        WorkerGroup.create(
            "actor_train",
            Stuck,
            plan.roles["actor_infer"],
            mode="local",
            init_kwargs={"fail": True},
        )


TORN_DOWN_WITH_TORCH = """
import time, torch
from rl_runtime.cluster.placement import plan_placement
from rl_runtime.cluster.worker_group import WorkerGroup

class Heavy:  # its teardown runs torch ops (each releases the GIL), as a model's does
    def __init__(self, rank, world_size, dist_env):
        self.a = torch.randn(128, 128)
    def __del__(self):
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            torch.mm(self.a, self.a)

plan = plan_placement({"actor_train": [0]}, num_devices=1)
group = WorkerGroup.create("actor_train", Heavy, plan.roles["actor_train"], mode="local")
group.shutdown()
print("shut down")
"""


def test_local_workers_are_torn_down_before_the_driver_exits(tmp_path):
    """--no-ray: shutdown waits until each worker's thread has released its object. A driver
    that exits while a daemon thread still runs torch dies with SIGABRT ("terminate called
    without an active exception") after a successful run: one CI run did (most likely FSDP2's
    process group torn down on the worker's thread), and this script did every time before the
    wait."""
    import subprocess
    import sys

    script = tmp_path / "driver.py"
    script.write_text(TORN_DOWN_WITH_TORCH)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "terminate called" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout.strip() == "shut down"


def test_local_worker_releases_its_object_on_stop():
    import weakref

    plan = plan_placement({"actor_train": [0]}, num_devices=1)
    group = WorkerGroup.create("actor_train", Echo, plan.roles["actor_train"], mode="local")
    worker = group.workers[0]
    assert group.call_all("whoami")[0][0] == 0
    obj = weakref.ref(worker._obj)
    worker.stop()
    assert worker.join(10.0)
    assert obj() is None and worker._obj is None  # released on its thread, by refcount


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_ray_worker_groups_placement_timeout_and_errors(tmp_path, monkeypatch):
    import ray

    from rl_runtime.cluster.ray_setup import RayOptions, shutdown_ray, start_ray
    from rl_runtime.cluster.worker_group import PlacementGroups

    resources = start_ray(RayOptions(num_cpus=2, env_vars={"RL_TEST_FLAG": "1"}))
    try:
        assert resources["CPU"] == 2
        plan = plan_placement(
            {"actor_train": [0, 1], "actor_infer": [1]}, num_devices=2, cpu_per_bundle=0.5
        )
        pgs = PlacementGroups(plan, timeout_s=60)
        # the driver moves after Ray started (as a driver joining a running cluster is elsewhere):
        # the actors work in the driver's directory, where its relative paths point
        monkeypatch.chdir(tmp_path)
        train = WorkerGroup.create(
            "actor_train", SetUpEcho, plan.roles["actor_train"], plan=plan, pgs=pgs,
            rpc_timeout=60,
        )  # fmt: skip
        assert train.call_all("cwd") == [str(tmp_path)] * 2
        infer = WorkerGroup.create(
            "actor_infer", Echo, plan.roles["actor_infer"], plan=plan, pgs=pgs, rpc_timeout=60
        )
        out = train.call_all("whoami")
        # the torch.distributed env reaches the actor process through runtime_env
        assert [o[3]["RANK"] for o in out] == ["0", "1"]
        assert {o[3]["WORLD_SIZE"] for o in out} == {"2"}
        assert infer.call_all("whoami")[0][:3] == (0, 1, "0")
        # what TrainWorker.shutdown asks before it destroys its process group: only the actors
        # (killed after it) skip that; the driver, where Ray runs too, does not
        from rl_runtime.cluster.worker_process import in_ray_actor

        assert train.call_all("in_ray_actor") == [True, True] and not in_ray_actor()
        with pytest.raises(RpcTimeoutError, match=r"actor_infer\.slow did not answer within 1 s"):
            infer.wait(infer.submit("slow", 30), "slow", timeout=1)
        with pytest.raises(RemoteCallError, match=r"actor_train\.boom failed remotely"):
            train.call_all("boom")
        train.shutdown()
        infer.shutdown()
        pgs.remove()
    finally:
        shutdown_ray()
    assert not ray.is_initialized()
