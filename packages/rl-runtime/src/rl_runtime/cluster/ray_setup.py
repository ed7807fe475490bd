"""Start or join Ray with settings that are safe on a laptop and on a cluster.

Embedded default: a local cluster with `num_cpus` from the config, the dashboard off, a small
object store on CPU, and the run's `system_envs` exported to every worker through runtime_env.
Every server of the embedded cluster (GCS, raylet, object and node managers, agents, metrics, the
core workers' gRPC servers) listens on loopback only: anyone who reaches the GCS can attach as a
driver and run code. `address=` (or RAY_ADDRESS) joins an existing cluster instead, with the
cluster's own addresses.

An embedded cluster's processes end with the driver, however it ends (rl_runtime.cluster.ray_reaper).
A run's SIGTERM handler (rl_runtime.run.interrupts) survives `ray.init`, which installs its own.

Ray on Linux replaces a loopback node address by the machine's network address unless
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (read when `ray` is first imported), so the embedded start
sets it before that import and, if `ray` was imported earlier, sets the constant it was read into.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Environment defaults that keep Ray quiet and small on a 2-core box.
QUIET_RAY_ENV = {
    "RAY_DEDUP_LOGS": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DISABLE_IMPORT_WARNING": "1",
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    "TOKENIZERS_PARALLELISM": "false",
}


@dataclass
class RayOptions:
    """How to start or join Ray."""

    address: str | None = None
    num_cpus: float | None = None
    num_gpus: int | None = None
    resources: dict[str, float] = field(default_factory=dict)
    object_store_bytes: int | None = 200 * 1024**2
    env_vars: dict[str, str] = field(default_factory=dict)
    include_dashboard: bool = False
    dashboard_host: str = "127.0.0.1"
    #: node address of an embedded cluster; every Ray server binds to it (loopback by default)
    node_ip_address: str = "127.0.0.1"
    log_to_driver: bool = True
    namespace: str = "rl"


def worker_threads(system_envs: Mapping[str, Any] | None, cpu_per_bundle: float) -> int:
    """Torch threads of every worker: the config's ``system_envs.OMP_NUM_THREADS`` if set, else
    the whole CPUs of a bundle (``cpu_per_bundle``, at least 1). Roles that share a bundle
    (colocated) take turns on it, so each may use all of its CPUs while it computes."""
    value = (system_envs or {}).get("OMP_NUM_THREADS")
    return int(value) if value is not None else max(1, int(cpu_per_bundle))


def worker_env_vars(system_envs: Mapping[str, Any] | None, threads: int = 1) -> dict[str, str]:
    """Env vars every worker gets: quiet Ray defaults, ``OMP_NUM_THREADS=threads`` (read by
    rl_runtime.cluster.worker_process for torch's threads), then the config's system_envs."""
    env = {**QUIET_RAY_ENV, "OMP_NUM_THREADS": str(threads)}
    for key, value in (system_envs or {}).items():
        env[str(key)] = str(value)
    return env


def device_env_defaults(
    device_kind: str, worker_env: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The device's environment defaults (`rl_sync.device.ascend_env_defaults` on NPU) that
    neither the workers' env (the config's system_envs) nor this process's environment sets;
    printed, since each changes how HCCL / vllm-ascend behave. Empty on cpu and cuda."""
    from rl_sync.device import apply_env_defaults

    present = {**(os.environ if environ is None else environ), **worker_env}
    applied = apply_env_defaults(device_kind, dict(present))  # type: ignore[arg-type]
    if applied:
        shown = " ".join(f"{k}={v}" for k, v in sorted(applied.items()))
        print(
            f"{device_kind} env defaults for every worker (set them to override): {shown}",
            flush=True,
        )
    return applied


def set_ray_env_defaults() -> None:
    """Set QUIET_RAY_ENV (without overriding the user's values) BEFORE the process first imports
    ray: Ray reads them once, at import. RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 in particular stops Ray
    from re-creating the driver's `uv run` project for every worker (a copied working dir with a
    fresh venv, where relative paths no longer resolve): workers use the driver's environment."""
    for key, value in QUIET_RAY_ENV.items():
        os.environ.setdefault(key, value)


def ray_init_kwargs(options: RayOptions, address: str | None) -> dict[str, Any]:
    """The `ray.init` arguments: join `address` as it is, or start an embedded cluster on
    `options.node_ip_address` (loopback by default) with the dashboard off."""
    kwargs: dict[str, Any] = {
        "namespace": options.namespace,
        "runtime_env": {"env_vars": worker_env_vars(options.env_vars)},
        "log_to_driver": options.log_to_driver,
        "ignore_reinit_error": True,
    }
    if address:
        kwargs["address"] = address
        return kwargs
    # a new local instance even when a `ray start` cluster runs on this machine (ray.init()
    # without an address would join that one, e.g. another user's, and refuse num_cpus)
    kwargs["address"] = "local"
    kwargs["num_cpus"] = options.num_cpus
    if options.num_gpus is not None:
        kwargs["num_gpus"] = options.num_gpus
    if options.resources:
        kwargs["resources"] = dict(options.resources)
    if options.object_store_bytes:
        kwargs["object_store_memory"] = int(options.object_store_bytes)
    kwargs["include_dashboard"] = options.include_dashboard
    if options.include_dashboard:
        kwargs["dashboard_host"] = options.dashboard_host
    kwargs["_node_ip_address"] = options.node_ip_address
    return kwargs


def joined_address(options: RayOptions) -> str | None:
    """The address of the cluster `start_ray` joins (`options.address`, else RAY_ADDRESS), or
    None: it starts an embedded one."""
    return options.address or os.environ.get("RAY_ADDRESS") or None


def start_ray(options: RayOptions) -> dict[str, float]:
    """Start an embedded Ray cluster or join `options.address` (or RAY_ADDRESS); returns the
    cluster's resources. An embedded cluster on a loopback `node_ip_address` is checked to have
    come up there (a RuntimeError otherwise).

    Idempotent: if Ray is already initialised in this process, its resources are returned.
    """
    set_ray_env_defaults()
    address = joined_address(options)
    loopback = not address and _is_loopback(options.node_ip_address)
    if loopback:
        os.environ[LOCAL_ONLY_ENV] = "0"
    import ray

    if ray.is_initialized():
        return dict(ray.cluster_resources())
    _keep_node_address_local(loopback)
    _keep_workers_in_this_environment()
    import signal

    from rl_runtime.run.interrupts import is_ours

    sigterm = signal.getsignal(signal.SIGTERM)
    ray.init(**ray_init_kwargs(options, address))
    if is_ours(sigterm):  # ray.init replaced it by one that aborts the driver (exit 134)
        signal.signal(signal.SIGTERM, sigterm)
    if loopback:
        node_ip = ray.util.get_node_ip_address()
        if not _is_loopback(node_ip):
            ray.shutdown()
            raise RuntimeError(
                f"the embedded Ray cluster came up on {node_ip}, not on loopback "
                f"({options.node_ip_address}); its servers would be reachable from the network"
            )
    if not address:  # an embedded cluster ends with this driver, however it ends
        from rl_runtime.cluster.ray_reaper import start_reaper

        node = ray._private.worker._global_node  # type: ignore[attr-defined]
        if node is not None:
            start_reaper(node.get_session_dir_path())
    return dict(ray.cluster_resources())


#: Ray's switch between a machine-local node address (0) and a network one (1, Linux default)
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _is_loopback(host: str) -> bool:
    from rl_sync.store import is_loopback_host

    return is_loopback_host(host)


_forced_local = False


def _keep_node_address_local(local: bool) -> None:
    """Ray read LOCAL_ONLY_ENV into `ray_constants.ENABLE_RAY_CLUSTER` at its first import; if that
    import came before this start (e.g. a test module importing ray), set the constant too. A
    later join of a cluster from this process undoes it (the driver needs its network address)."""
    global _forced_local
    from ray._private import ray_constants

    if local:
        ray_constants.ENABLE_RAY_CLUSTER = False
        _forced_local = True
    elif _forced_local:
        os.environ.pop(LOCAL_ONLY_ENV, None)
        ray_constants.ENABLE_RAY_CLUSTER = not ray_constants.IS_WINDOWS_OR_OSX
        _forced_local = False


def _keep_workers_in_this_environment() -> None:
    """Ray read RAY_ENABLE_UV_RUN_RUNTIME_ENV into its constants at its first import; if that
    import came before `set_ray_env_defaults` (a script or test module importing ray first), under
    `uv run` every worker would start in a fresh copy of the project without its packages (workers
    failing with "No module named 'ray'" until the call times out). Apply the default there too,
    unless the user turned the hook on."""
    from ray._private import ray_constants

    if (
        os.environ.get("RAY_ENABLE_UV_RUN_RUNTIME_ENV")
        == QUIET_RAY_ENV["RAY_ENABLE_UV_RUN_RUNTIME_ENV"]
    ):
        ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False


def shutdown_ray() -> None:
    """Shut Ray down if this process started or joined it."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
