"""A worker's environment and torch threads: the config's system_envs and the CPUs its bundle
reserves reach the worker, with Ray and in-process; in-process workers give the driver's
environment, threads and global RNG streams back at shutdown."""

from __future__ import annotations

import os

import pytest
import torch

from rl_runtime.cluster.cluster import Cluster, RoleSpec
from rl_runtime.cluster.ray_setup import RayOptions, worker_threads


class Probe:
    """Starts like rl_runtime.cluster.workers' classes (`_init_process`) and reports what it got."""

    def __init__(self, rank, world_size, dist_env):
        from rl_runtime.cluster.workers import _init_process

        _init_process(dist_env, seed=0)

    def ready(self):
        return True

    def report(self):
        return {
            "threads": torch.get_num_threads(),
            "probe": os.environ.get("RL_PROBE"),
            "rank": os.environ.get("RANK"),
        }

    def shutdown(self):
        return None


@pytest.mark.parametrize(
    ("system_envs", "cpu_per_bundle", "threads"),
    [
        ({}, 1.0, 1),
        ({}, 2.0, 2),
        ({}, 3.5, 3),  # whole CPUs
        ({}, 0.5, 1),  # at least one
        ({"OMP_NUM_THREADS": "3"}, 1.0, 3),  # the config's value wins
        ({"OMP_NUM_THREADS": "1"}, 4.0, 1),
    ],
)
def test_worker_threads_follow_the_config_then_the_bundle(system_envs, cpu_per_bundle, threads):
    assert worker_threads(system_envs, cpu_per_bundle) == threads


def _start(use_ray: bool, cpu_per_bundle: float, system_envs: dict[str, str]) -> Cluster:
    return Cluster.start(
        [RoleSpec("actor_train", Probe, [0])],
        num_devices=1,
        use_ray=use_ray,
        ray_options=RayOptions(num_cpus=2, env_vars=system_envs),
        cpu_per_bundle=cpu_per_bundle,
        rpc_timeout=120,
    )


@pytest.mark.parametrize(
    ("cpu_per_bundle", "system_envs", "threads"),
    [(2.0, {}, 2), (2.0, {"OMP_NUM_THREADS": "1"}, 1)],
)
def test_in_process_workers_get_their_environment_and_give_the_drivers_back(
    monkeypatch, cpu_per_bundle, system_envs, threads
):
    monkeypatch.delenv("RL_PROBE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("RL_DRIVER_ONLY", "kept")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cluster = _start(False, cpu_per_bundle, {"RL_PROBE": "x", **system_envs})
        try:
            (got,) = cluster["actor_train"].call_all("report")
            assert got == {"threads": threads, "probe": "x", "rank": "0"}
        finally:
            cluster.shutdown()
        assert "RL_PROBE" not in os.environ and "RANK" not in os.environ
        assert os.environ["RL_DRIVER_ONLY"] == "kept"
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def _seed_all(seed: int) -> None:
    import random

    import numpy as np

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _draws() -> tuple[list[float], float, float]:
    import random

    import numpy as np

    return torch.rand(3).tolist(), random.random(), float(np.random.rand())


def test_in_process_workers_give_the_drivers_random_streams_back():
    """A worker seeds the global streams it shares with the driver (Probe: seed 0); after
    shutdown the driver draws what it would have drawn without the cluster."""
    _seed_all(1234)
    expected = _draws()
    _seed_all(1234)
    cluster = _start(False, 1.0, {})
    try:
        assert _draws() != expected  # the worker's seed 0 took the streams over
    finally:
        cluster.shutdown()
    assert _draws() == expected


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_ray_workers_get_the_system_envs_and_their_bundles_cpus_as_threads():
    cluster = _start(True, 2.0, {"RL_PROBE": "y"})
    try:
        (got,) = cluster["actor_train"].call_all("report")
        assert got == {"threads": 2, "probe": "y", "rank": "0"}
    finally:
        cluster.shutdown()


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_a_placement_the_embedded_ray_cluster_cannot_hold_fails_at_once(monkeypatch):
    """One bundle of 3 CPUs on an embedded cluster of 2: Ray would wait rpc_timeout for it and
    then fail with a RuntimeError; the cluster refuses it by name and shuts Ray down."""
    import ray

    from rl_config.errors import ConfigError

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError, match=r"placement: CPU: the placement needs 3 .* has 2"):
        _start(True, 3.0, {})
    assert not ray.is_initialized()
