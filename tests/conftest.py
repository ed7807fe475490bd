import time
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def checkpoint_key_file(tmp_path_factory):
    """Sign test checkpoints with a throwaway key (inherited by the app subprocesses and Ray
    workers), never the user's ~/.config/rl-stack/checkpoint.key."""
    from rl_train.testing import throwaway_checkpoint_key

    with throwaway_checkpoint_key(tmp_path_factory.mktemp("ckpt_key")) as path:
        yield path


@pytest.fixture(scope="session")
def shared_tiny_model(tmp_path_factory) -> Path:
    """The default tiny model (`rl_rollout.tiny_model.build_tiny_model`'s defaults, which is what
    the apps' `build_tiny_model` option builds), built once per test process (xdist worker)."""
    from rl_rollout.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.getbasetemp() / "shared_tiny_model")


@pytest.fixture(autouse=True)
def _tiny_model_built_once(request):
    """A slow test's `tmp_path/tiny_model` links to the session's default tiny model. The app
    launches build their model there (`<app>.build_tiny_model`, `pretrain`); each finds it
    complete and loads it instead of building its own (~2 s of CPU per test). Nothing writes
    into a model directory; a build with other parameters there replaces the link with a
    directory of its own (rl_rollout.tiny_model.build_tiny_model), the shared model untouched."""
    if request.node.get_closest_marker("slow") is None or "tmp_path" not in request.fixturenames:
        return
    tmp_path = request.getfixturevalue("tmp_path")
    shared = request.getfixturevalue("shared_tiny_model")
    (tmp_path / "tiny_model").symlink_to(shared, target_is_directory=True)


#: the CPU defaults' embedded Ray cluster (loopback, 2 CPUs, a 200 MiB object store)
SHARED_RAY = {"num_cpus": 2, "object_store_bytes": 200 * 1024**2}


@pytest.fixture(scope="module")
def _module_ray():
    """An embedded Ray cluster for one test module, as the CPU defaults start theirs."""
    from rl_runtime.cluster.ray_setup import RayOptions, shutdown_ray, start_ray

    start_ray(RayOptions(**SHARED_RAY))
    yield
    shutdown_ray()


@pytest.fixture
def shared_ray(_module_ray):
    """The module's Ray cluster, which the test's in-process runs join instead of each starting
    and stopping its own (~5 s a run on 2 cores): rl_runtime's Cluster leaves a Ray it did not
    start running. After the test every CPU of it is free again (no worker or placement group
    of a run left behind); else the test fails and the module's later tests get a fresh one."""
    import ray

    from rl_runtime.cluster.ray_setup import RayOptions, shutdown_ray, start_ray

    yield
    deadline = time.monotonic() + 30.0
    while ray.available_resources().get("CPU", 0.0) < ray.cluster_resources().get("CPU", 0.0):
        if time.monotonic() > deadline:
            held = ray.available_resources()
            shutdown_ray()
            start_ray(RayOptions(**SHARED_RAY))
            pytest.fail(f"Ray resources still held after the test: {held}")
        time.sleep(0.2)
