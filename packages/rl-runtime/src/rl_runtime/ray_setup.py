"""Start or join Ray with settings that are safe on a laptop and on a cluster.

Embedded default: a local cluster with `num_cpus` from the config, the dashboard off, a small
object store on CPU, and the run's `system_envs` exported to every worker through runtime_env.
`address=` (or RAY_ADDRESS) joins an existing cluster instead.
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
    log_to_driver: bool = True
    namespace: str = "rl"


def worker_env_vars(system_envs: Mapping[str, Any] | None) -> dict[str, str]:
    """Env vars every worker gets: quiet Ray defaults, thread caps, then the config's system_envs."""
    env = dict(QUIET_RAY_ENV)
    env.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    for key, value in (system_envs or {}).items():
        env[str(key)] = str(value)
    return env


def set_ray_env_defaults() -> None:
    """Set QUIET_RAY_ENV (without overriding the user's values) BEFORE the process first imports
    ray: Ray reads them once, at import. RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 in particular stops Ray
    from re-creating the driver's `uv run` project for every worker (a copied working dir with a
    fresh venv, where relative paths no longer resolve): workers use the driver's environment."""
    for key, value in QUIET_RAY_ENV.items():
        os.environ.setdefault(key, value)


def start_ray(options: RayOptions) -> dict[str, float]:
    """Start an embedded Ray cluster or join `options.address`; returns cluster resources.

    Idempotent: if Ray is already initialised in this process, its resources are returned.
    """
    set_ray_env_defaults()
    import ray

    if ray.is_initialized():
        return dict(ray.cluster_resources())
    address = options.address or os.environ.get("RAY_ADDRESS") or None
    runtime_env = {"env_vars": worker_env_vars(options.env_vars)}
    kwargs: dict[str, Any] = {
        "namespace": options.namespace,
        "runtime_env": runtime_env,
        "log_to_driver": options.log_to_driver,
        "ignore_reinit_error": True,
    }
    if address:
        kwargs["address"] = address
    else:
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
    ray.init(**kwargs)
    return dict(ray.cluster_resources())


def shutdown_ray() -> None:
    """Shut Ray down if this process started or joined it."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
