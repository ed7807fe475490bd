"""Worker groups: the workers of one role, as Ray actors in placement groups or in-process.

`WorkerGroup.create(role, cls, placement, ...)` starts one worker per `WorkerSlot` of the role.
Ray mode places each actor in its colocation group's placement group at its slot's bundle with a
fraction of the device (GPU via `num_gpus`, NPU via the custom `NPU` resource, CPU otherwise),
and, when the plan says so, the env var naming its devices (`placement.worker_device_env`); the
actor enters the driver's working directory (rl_runtime.cluster.worker_process._init_process).
Local mode (`mode="local"`) builds the same classes in this process, each on its own thread
(`rl_runtime.cluster.local_worker.LocalWorker`), for `--no-ray` runs and unit tests; one call runs at a
time, in submission order (as before, so seeded runs stay deterministic), and the driver waits for
it with the group's `rpc_timeout`. Every wait, in either mode, goes through `rl_runtime.cluster.rpc.call`.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import Future, wait
from typing import Any, Literal

from rl_runtime.cluster.local_worker import LocalWorker
from rl_runtime.cluster.placement import PlacementPlan, RolePlacement, worker_device_env
from rl_runtime.cluster.rpc import RpcTimeoutError, call

Mode = Literal["ray", "local"]
#: the driver's working directory, which a Ray actor's process enters before anything else
#: (rl_runtime.cluster.worker_process._init_process)
DRIVER_CWD_ENV = "RL_DRIVER_CWD"


def _wait_local(future: Future, role: str, method: str, timeout_s: float) -> Future:
    """Wait until a local call is done (its result or exception stays in the future)."""
    if not wait([future], timeout=timeout_s).done:
        future.cancel()
        raise RpcTimeoutError(role, method, timeout_s, 1)
    return future


class PlacementGroups:
    """One Ray placement group per colocation group of a plan."""

    def __init__(self, plan: PlacementPlan, *, timeout_s: float, strategy: str = "PACK") -> None:
        from ray.util.placement_group import placement_group

        self.plan = plan
        self.groups = []
        for index in range(len(plan.groups)):
            pg = placement_group(plan.bundles(index), strategy=strategy)
            self.groups.append(pg)
        import ray

        ready = [pg.ready() for pg in self.groups]
        _done, pending = ray.wait(ready, num_returns=len(ready), timeout=timeout_s)
        if pending:
            wanted = [plan.bundles(i) for i in range(len(plan.groups))]
            raise RuntimeError(
                f"Ray could not reserve the placement groups {wanted} within {timeout_s:g} s; "
                f"cluster has {ray.cluster_resources()}. Check device_mapping against the "
                f"devices Ray sees (num_cpus / num_gpus / NPU resources)."
            )

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in self.groups:
            remove_placement_group(pg)
        self.groups = []


class WorkerGroup:
    """The workers of one role; call methods on all of them with a bounded wait."""

    def __init__(
        self,
        role: str,
        workers: list[Any],
        mode: Mode,
        rpc_timeout: float,
        rendezvous_token: str | None = None,
    ) -> None:
        self.role = role
        self.workers = workers
        self.mode = mode
        self.rpc_timeout = rpc_timeout
        #: names the role's node-local process-group rendezvous (rl_train.dist.RENDEZVOUS_ENV)
        self.rendezvous_token = rendezvous_token

    @classmethod
    def create(
        cls,
        role: str,
        worker_cls: type,
        placement: RolePlacement,
        *,
        plan: PlacementPlan | None = None,
        pgs: PlacementGroups | None = None,
        mode: Mode = "ray",
        rpc_timeout: float = 600.0,
        init_kwargs: dict[str, Any] | None = None,
        env_vars: dict[str, str] | None = None,
        max_concurrency: int = 1,
    ) -> WorkerGroup:
        """Start `placement.num_workers` workers of `worker_cls(rank=, world_size=, **init_kwargs)`.

        `max_concurrency > 1` makes Ray actors threaded (that many calls at once, e.g. a weight
        sync received while a rollout runs); local workers always run one call at a time.

        Each worker also gets the torch.distributed env for process groups inside the role: RANK,
        WORLD_SIZE, LOCAL_RANK and, instead of a MASTER_ADDR/MASTER_PORT that a port race can
        break, a fresh token naming the role's node-local rendezvous (rl_train.dist). Store files
        an earlier driver left on this node when it was killed are removed first
        (rl_sync.store.sweep_leaked_rendezvous).
        """
        from rl_sync.store import new_rendezvous_token, sweep_leaked_rendezvous
        from rl_train.dist import RENDEZVOUS_ENV

        world = placement.num_workers
        sweep_leaked_rendezvous()
        token = new_rendezvous_token()
        workers: list[Any] = []
        for slot in placement.workers:
            dist_env = {
                "RANK": str(slot.rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": "0",
                RENDEZVOUS_ENV: token,
            }
            kwargs = dict(init_kwargs or {})
            kwargs.update(rank=slot.rank, world_size=world, dist_env=dist_env)
            if mode == "local":
                local = LocalWorker(worker_cls, kwargs, name=f"{role}-{slot.rank}")
                _wait_local(local.constructed, role, "__init__", rpc_timeout).result()
                workers.append(local)
                continue
            import ray
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            if pgs is None or plan is None:
                raise ValueError("ray mode needs the plan and its placement groups")
            options: dict[str, Any] = {
                "num_cpus": slot.cpus,
                "name": f"{role}-{slot.rank}-{token[:12]}",
                "runtime_env": {
                    "env_vars": {
                        **(env_vars or {}),
                        **dist_env,
                        **worker_device_env(plan, slot),
                        DRIVER_CWD_ENV: os.getcwd(),
                    }
                },
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=pgs.groups[placement.colocation_group],
                    placement_group_bundle_index=slot.bundle_index,
                ),
                "max_restarts": 0,
            }
            if max_concurrency > 1:
                options["max_concurrency"] = max_concurrency
            amount = slot.device_request
            if plan.resource_name == "GPU":
                options["num_gpus"] = amount
            elif plan.resource_name is not None:
                options["resources"] = {plan.resource_name: amount}
            actor_cls = ray.remote(worker_cls)
            workers.append(actor_cls.options(**options).remote(**kwargs))
        return cls(role, workers, mode, rpc_timeout, rendezvous_token=token)

    # -- calls -------------------------------------------------------------------------------
    def submit(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Start `method` on every worker; returns refs (Ray) or futures (local)."""
        return [self._submit_one(w, method, args, kwargs) for w in self.workers]

    def submit_each(self, method: str, per_worker_args: Sequence[tuple]) -> list[Any]:
        """Start `method` on worker i with `per_worker_args[i]`."""
        if len(per_worker_args) != len(self.workers):
            raise ValueError(
                f"{self.role}.{method}: {len(per_worker_args)} argument tuples for "
                f"{len(self.workers)} workers"
            )
        return [
            self._submit_one(w, method, tuple(a), {}) for w, a in zip(self.workers, per_worker_args)
        ]

    def submit_to(self, rank: int, method: str, *args: Any, timeout: float | None = None) -> Any:
        """Start `method` on worker `rank` alone; a local worker runs it now, for `timeout`
        seconds at most (default rpc_timeout: `RpcTimeoutError`), a Ray actor returns its ref
        (`wait` bounds it)."""
        worker = self.workers[rank]
        if self.mode == "local":
            future = worker.submit(method, args, {})
            return _wait_local(future, self.role, method, timeout or self.rpc_timeout)
        return getattr(worker, method).remote(*args)

    def wait(self, refs: list[Any], method: str, timeout: float | None = None) -> list[Any]:
        return call(refs, timeout=timeout or self.rpc_timeout, role=self.role, method=method)

    def call_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run `method` on every worker and return their results (bounded by rpc_timeout)."""
        return self.wait(self.submit(method, *args, **kwargs), method)

    def call_rank0(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.wait([self._submit_one(self.workers[0], method, args, kwargs)], method)[0]

    def _submit_one(self, worker: Any, method: str, args: tuple, kwargs: dict) -> Any:
        if self.mode == "local":
            return _wait_local(
                worker.submit(method, args, kwargs), self.role, method, self.rpc_timeout
            )
        return getattr(worker, method).remote(*args, **kwargs)

    def shutdown(self) -> None:
        """Kill Ray actors, or end local workers' threads, after a bounded `shutdown` call on
        workers that have one."""
        if self.mode == "local":
            futures: list[Future] = []
            try:  # a worker stuck in an earlier (timed-out) call never gets to this one
                with contextlib.suppress(RpcTimeoutError):
                    futures = [w.submit("shutdown", optional=True) for w in self.workers]
                    self.wait(futures, "shutdown", timeout=60.0)
            finally:
                self._end_local_threads(stuck={i for i, f in enumerate(futures) if not f.done()})
            return
        import ray

        with contextlib.suppress(Exception):
            self.wait(self.submit("shutdown"), "shutdown", timeout=60.0)
        for w in self.workers:
            ray.kill(w, no_restart=True)
        self.workers = []
        self._remove_rendezvous()

    def _end_local_threads(self, stuck: set[int], timeout_s: float = 60.0) -> None:
        """Stop every local worker's thread and wait (bounded) until each has released its
        object, so that no daemon thread still runs torch when the driver exits (that aborts the
        process: rl_runtime.cluster.local_worker). `stuck`: indices of workers still inside an earlier
        call, which cannot end; they are left behind, as is a worker past `timeout_s` (warned)."""
        for w in self.workers:
            w.stop()
        deadline = time.monotonic() + timeout_s
        for i, w in enumerate(self.workers):
            if i not in stuck and not w.join(deadline - time.monotonic()):
                warnings.warn(
                    f"{self.role} worker {i} did not end within {timeout_s:g} s of shutdown; "
                    "the process may abort at exit",
                    RuntimeWarning,
                    stacklevel=3,
                )
        self.workers = []

    def _remove_rendezvous(self) -> None:
        """Remove the rendezvous file if it is on this node (rl_sync.store.remove_node_local_store:
        the workers' own stores do not reliably remove it)."""
        if self.rendezvous_token is not None:
            from rl_sync.store import remove_node_local_store

            remove_node_local_store(self.rendezvous_token)
