"""The cluster of a run: Ray (or in-process) workers per role, placed by device_mapping.

`Cluster.start(specs, ...)` plans placement, starts Ray, reserves placement groups and starts one
`WorkerGroup` per role. `enter_phase("rollout" | "train")` implements colocation: when the rollout
engine shares devices with a trainer, the trainer offloads before rollout and the engine sleeps
before training.
The weights move into the engines through rl_runtime.cluster.weight_sync.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rl_runtime.cluster.placement import PlacementPlan, plan_placement
from rl_runtime.cluster.ray_setup import (
    RayOptions,
    device_env_defaults,
    joined_address,
    set_ray_env_defaults,
    shutdown_ray,
    start_ray,
    worker_env_vars,
    worker_threads,
)
from rl_runtime.cluster.worker_group import PlacementGroups, WorkerGroup

TRAIN_ROLES = ("actor_train", "critic", "reference")
INFER_ROLE = "actor_infer"


@dataclass
class RoleSpec:
    """What to run for one role: the worker class, its devices and constructor arguments."""

    role: str
    worker_cls: type
    device_mapping: Sequence[int]
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    devices_per_worker: int = 1
    #: calls a Ray actor of this role runs at once (rollout workers: 2, so a weight sync can be
    #: received while a rollout is generating: partial rollout)
    max_concurrency: int = 1


class Cluster:
    """Worker groups of every role plus the placement they were started with."""

    def __init__(
        self,
        plan: PlacementPlan,
        groups: dict[str, WorkerGroup],
        pgs: PlacementGroups | None,
        *,
        use_ray: bool,
        owns_ray: bool,
    ) -> None:
        self.plan = plan
        self.groups = groups
        self.pgs = pgs
        self.use_ray = use_ray
        self.owns_ray = owns_ray
        self.phase: str | None = None
        self.startup_seconds = 0.0
        #: the driver's environment and threads before in-process workers took them
        self.driver_state: DriverState | None = None

    @classmethod
    def start(
        cls,
        specs: Sequence[RoleSpec],
        *,
        num_devices: int,
        device_kind: str = "cpu",
        resource_name: str | None = None,
        use_ray: bool = True,
        ray_options: RayOptions | None = None,
        rpc_timeout: float = 600.0,
        cpu_per_bundle: float = 1.0,
        devices_per_node: int | None = None,
        node_resources: Sequence[str] | None = None,
    ) -> Cluster:
        """Plan, start Ray (or join it), reserve placement groups and start every role's workers.
        `devices_per_node`/`node_resources` pin device bundles to nodes (see
        `rl_runtime.cluster.placement`)."""
        t0 = time.perf_counter()
        plan = plan_placement(
            {s.role: list(s.device_mapping) for s in specs},
            num_devices=num_devices,
            device_kind=device_kind,
            resource_name=resource_name,
            devices_per_worker={s.role: s.devices_per_worker for s in specs},
            cpu_per_bundle=cpu_per_bundle,
            devices_per_node=devices_per_node,
            node_resources=node_resources,
        )
        pgs = None
        owns_ray = False
        options = ray_options or RayOptions()
        env_vars = worker_env_vars(
            options.env_vars, worker_threads(options.env_vars, cpu_per_bundle)
        )
        env_vars.update(device_env_defaults(device_kind, env_vars))
        driver = None
        if use_ray:
            set_ray_env_defaults()
            import ray

            owns_ray = not ray.is_initialized()
            resources = start_ray(options)
            embedded = owns_ray and joined_address(options) is None
            error = embedded_fit_error(plan, resources) if embedded else None
            if error is not None:
                shutdown_ray()
                raise error
            pgs = PlacementGroups(plan, timeout_s=rpc_timeout)
        else:  # the workers run in this process: it takes their environment until shutdown
            driver = DriverState.take()
            os.environ.update(env_vars)
        groups: dict[str, WorkerGroup] = {}
        try:
            for spec in specs:
                groups[spec.role] = WorkerGroup.create(
                    spec.role,
                    spec.worker_cls,
                    plan.roles[spec.role],
                    plan=plan,
                    pgs=pgs,
                    mode="ray" if use_ray else "local",
                    rpc_timeout=rpc_timeout,
                    init_kwargs=spec.init_kwargs,
                    env_vars=env_vars,
                    max_concurrency=spec.max_concurrency,
                )
            for group in groups.values():  # constructors run concurrently on Ray; wait here
                group.call_all("ready")
        except BaseException:
            for group in groups.values():
                group.shutdown()
            if pgs is not None:
                pgs.remove()
            if owns_ray:
                shutdown_ray()
            if driver is not None:
                driver.restore()
            raise
        cluster = cls(plan, groups, pgs, use_ray=use_ray, owns_ray=owns_ray)
        cluster.driver_state = driver
        cluster.startup_seconds = time.perf_counter() - t0
        return cluster

    def __getitem__(self, role: str) -> WorkerGroup:
        if role not in self.groups:
            raise KeyError(f"no worker group for role {role!r}; started: {sorted(self.groups)}")
        return self.groups[role]

    def has(self, role: str) -> bool:
        return role in self.groups

    def colocated_with_infer(self) -> list[str]:
        """The training roles sharing devices with the engines (a model reward's role wakes
        and sleeps around its own scorings: rl_runtime.step.model_rewards)."""
        if INFER_ROLE not in self.plan.roles:
            return []
        shared = self.plan.roles[INFER_ROLE].colocated_with
        return [r for r in shared if r in self.groups and r in TRAIN_ROLES]

    def enter_phase(
        self, phase: Literal["rollout", "train"], *, handoff: Callable[[], Any] | None = None
    ) -> Any:
        """Hand colocated devices to the phase's workers (no-op without colocation).

        Into ``rollout``: the engines wake up first, then ``handoff()`` runs (the weight sync, while
        the trainer still holds its weights on the device and the engines can take them), then the
        trainers offload. Into ``train``: the engines sleep, then the trainers onload. Returns what
        ``handoff`` returned (it runs in either case, colocated or not).
        """
        if phase == self.phase:
            return handoff() if handoff is not None else None
        sharers = self.colocated_with_infer()
        colocated = bool(sharers) and INFER_ROLE in self.groups
        result = None
        if phase == "rollout":
            if colocated and self.phase is not None:
                self.groups[INFER_ROLE].call_all("wake_up")
            if handoff is not None:
                result = handoff()
            if colocated:
                for role in sharers:
                    self.groups[role].call_all("offload")
        else:
            if colocated:
                self.groups[INFER_ROLE].call_all("sleep", 1)
                for role in sharers:
                    self.groups[role].call_all("onload")
            if handoff is not None:
                result = handoff()
        self.phase = phase
        return result

    def shutdown(self) -> None:
        for group in self.groups.values():
            group.shutdown()
        self.groups = {}
        if self.pgs is not None:
            self.pgs.remove()
            self.pgs = None
        if self.owns_ray:
            shutdown_ray()
        if self.driver_state is not None:
            self.driver_state.restore()
            self.driver_state = None


@dataclass(frozen=True)
class DriverState:
    """What in-process (`--no-ray`) workers change in the process they share with the driver:
    the environment (system_envs, the torch.distributed variables of each rank), torch's thread
    count and the global RNG streams (each worker seeds torch's, python's and numpy's). Taken
    before they start, restored at shutdown."""

    environ: dict[str, str]
    threads: int
    rng: dict[str, Any]  # torch CPU, python `random`, numpy legacy global (rl_train.checkpoint)

    @classmethod
    def take(cls) -> DriverState:
        import torch

        from rl_train.checkpoint import capture_rng

        return cls(dict(os.environ), torch.get_num_threads(), capture_rng())

    def restore(self) -> None:
        import torch

        from rl_train.checkpoint import restore_rng

        for key in set(os.environ) - set(self.environ):
            del os.environ[key]
        os.environ.update(self.environ)
        torch.set_num_threads(self.threads)
        restore_rng(self.rng)


def embedded_fit_error(plan: PlacementPlan, available: Mapping[str, float]) -> Exception | None:
    """The ``ConfigError`` for a plan that reserves more than an embedded Ray cluster holds
    (``available``: its resources), else None. Nothing joins an embedded cluster, so its
    placement groups would wait until their timeout (rpc_timeout) and then fail."""
    lines = plan.shortfall(available)
    if not lines:
        return None
    from rl_config.errors import ConfigError, ConfigIssue

    hint = ("; the Ray cluster a run starts has num_cpus CPUs and this machine's devices: raise "
            "num_cpus, lower cpu_per_bundle, map fewer devices, or join a cluster that has "
            "them (RAY_ADDRESS)")  # fmt: skip
    return ConfigError([ConfigIssue("placement", line + hint) for line in lines])
