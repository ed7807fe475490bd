"""Checks of a composed run before anything starts: optional packages the config needs, what
an in-process run (`--no-ray`) cannot do, and the CPUs an embedded Ray cluster holds; and the
environment the workers inherit for sandboxed calls."""

from __future__ import annotations

import os
from typing import Any

from rl_runtime.compose import Components, RunComponents
from rl_runtime.run.plan import placement_plan


def check_embedded_cpus(components: Components, options: Any) -> None:
    """Before Ray starts (a dry run included): a ``ConfigError`` when the placement reserves
    more CPUs than the embedded cluster the run will start (``num_cpus``) holds; skipped when
    joining a cluster (RAY_ADDRESS) or when num_cpus is left to Ray. Devices are checked once
    Ray reports them (rl_runtime.cluster.cluster.embedded_fit_error)."""
    from rl_runtime.cluster.cluster import embedded_fit_error
    from rl_runtime.cluster.ray_setup import RayOptions, joined_address

    if not options.use_ray or options.num_cpus is None or joined_address(RayOptions()):
        return
    plan = placement_plan(components, options.cpu_per_bundle)
    error = embedded_fit_error(plan, {**plan.resource_totals(), "CPU": options.num_cpus})
    if error is not None:
        raise error


def check_optional_packages(cfg: Any) -> list[str]:
    """Before anything starts: a ``ConfigError`` naming each optional package the config needs
    that is not installed (key, reason and the install command); returns the descriptions of
    missing packages the run can do without (warnings)."""
    from rl_config.errors import ConfigError, ConfigIssue
    from rl_config.extras import missing_extras

    missing = missing_extras(cfg)
    required = [ConfigIssue(e.key, e.describe()) for e in missing if e.required]
    if required:
        raise ConfigError(required)
    return [e.describe() for e in missing]


def check_in_process(components: RunComponents, use_ray: bool) -> list[str]:
    """Without Ray (`--no-ray`) every worker runs in this process, and a process holds one rank
    of a training role's process group: a ``ConfigError`` naming each training role mapped to
    more than one rank, before anything starts (its first rank would otherwise wait for the
    others until rpc_timeout), and ``async.partial_rollout`` (it needs Ray's concurrent
    calls). Returns warnings for the keys only Ray reads (``node_resources``,
    ``weight_sync_host``, ``weight_sync_transport`` and ``model_update_buffer_size_mb`` off
    their defaults), which such a run ignores."""
    if use_ray:
        return []
    from rl_config.errors import ConfigError, ConfigIssue

    issues = []
    for r in components.roles:
        ranks = len(r.device_mapping) // max(1, r.devices_per_worker)
        if r.trains and ranks > 1:
            issues.append(
                ConfigIssue(
                    f"{r.role}.device_mapping",
                    f"{ranks} ranks, but without Ray (--no-ray) every worker runs in this one "
                    "process, which holds one rank of a training role; run with Ray, or map "
                    f"the role to {r.devices_per_worker} device(s)",
                )
            )
    asynchronous = components.asynchronous
    if asynchronous is not None and asynchronous.partial_rollout:
        issues.append(
            ConfigIssue(
                "async.partial_rollout",
                "needs Ray: without it (--no-ray) a rollout worker runs one call at a time, so "
                "a weight update could never reach a generation in flight",
            )
        )
    if issues:
        raise ConfigError(issues)
    from rl_config.schema import ExperimentConfig

    cluster = components.cluster
    default_mb = ExperimentConfig.model_fields["model_update_buffer_size_mb"].default
    buffer_mb = cluster.sync_bucket_bytes // 1024**2  # 0: no weight sync (DPO)
    ignored = [("node_resources", cluster.node_resources, "there are no Ray nodes to pin to"),
               ("weight_sync_host", cluster.sync_host,
                "the weights reach the engines in this process"),
               ("weight_sync_transport", cluster.sync_transport
                if cluster.sync_transport != "auto" else None,
                "the weights reach the engines in this process"),
               ("model_update_buffer_size_mb", buffer_mb if buffer_mb not in (0, default_mb)
                else None, "the weights reach the engines in this process as whole tensors, "
                "not in transfer buckets")]  # fmt: skip
    return [
        f"{key}={value!r} has no effect without Ray (--no-ray): {why}"
        for key, value, why in ignored
        if value is not None
    ]


def sandbox_hidden_env() -> dict[str, str]:
    """The paths sandboxed calls must see empty (`rl_envs.sandbox.credentials.HIDE_VARIABLE`),
    for the workers' environment: a pool a worker starts hides them too."""
    from rl_envs.sandbox.credentials import HIDE_VARIABLE

    value = os.environ.get(HIDE_VARIABLE)
    return {HIDE_VARIABLE: value} if value else {}
