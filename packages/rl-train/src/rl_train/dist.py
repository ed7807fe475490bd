"""Process-group setup from the usual env vars (RANK, WORLD_SIZE, MASTER_ADDR/PORT, LOCAL_RANK),
with the collective backend chosen by rl_sync.device, and a small multi-process launcher.

Groups whose ranks all run on one node (rl-runtime's worker groups, :func:`spawn`) meet without a
port: ``$RL_RENDEZVOUS_TOKEN`` names a node-local ``FileStore`` (rl_sync.store.node_local_store;
an in-memory store for a single rank).
A port picked by the launcher and bound later by rank 0 can be taken in between (it was, once in
CI: ``EADDRINUSE`` in a trainer's start on a loaded Ray machine)."""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import signal
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rl_sync.device import DeviceKind, backend_for, detect_device_kind, set_device
from rl_sync.store import (
    create_store,
    is_loopback_host,
    loopback_socket_env,
    new_rendezvous_token,
    node_local_store,
    node_local_store_path,
)

#: env var naming the node-local rendezvous of a group launched on one node (see module docstring)
RENDEZVOUS_ENV = "RL_RENDEZVOUS_TOKEN"
#: the signal on which a spawned rank dumps its threads' stacks (:func:`spawn`'s timeout)
STACK_DUMP_SIGNAL = signal.SIGUSR1


def is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_dist() else 0


def world_size() -> int:
    return dist.get_world_size() if is_dist() else 1


def barrier() -> None:
    if is_dist() and dist.get_world_size() > 1:
        dist.barrier()


def init_distributed(
    kind: DeviceKind | None = None, *, timeout_s: float = 600.0, group_when_alone: bool = False
) -> tuple[DeviceKind, torch.device]:
    """Initialise the default process group from env vars when WORLD_SIZE is set (idempotent).

    Returns the device kind and this rank's device. Without WORLD_SIZE this is a single process
    and no group is created, unless ``group_when_alone``: then a group of one rank on an
    in-memory store (a backend that needs a group even alone, DeepSpeed, would otherwise make its
    own by MPI discovery: an ImportError without mpi4py, and with it a store on the first address
    of ``hostname -I``, port 29500). With ``$RL_RENDEZVOUS_TOKEN`` the ranks (all on this node) meet in a
    node-local FileStore, without a port; else at MASTER_ADDR:MASTER_PORT. Either way a group on
    one node listens on loopback only: a loopback MASTER_ADDR's store binds loopback alone (see
    :func:`rl_sync.store.create_store`), and the backend's sockets (gloo's pairs, the NCCL/HCCL
    bootstrap) use the loopback interface (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``/
    ``HCCL_SOCKET_IFNAME``: :func:`rl_sync.store.loopback_socket_env`; none the user set is
    changed).
    """
    kind = kind or detect_device_kind()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = set_device(local_rank, kind)
    alone = group_when_alone and "WORLD_SIZE" not in os.environ
    if not is_dist() and (alone or int(os.environ.get("WORLD_SIZE", "0")) >= 1):
        rank_, world = (0, 1) if alone else (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
        backend = backend_for(kind)
        store = None
        token = new_rendezvous_token() if alone else os.environ.get(RENDEZVOUS_ENV)
        master = os.environ.get("MASTER_ADDR", "")
        if token:
            store = node_local_store(token, world)
        elif is_loopback_host(master):
            store = create_store(
                master, int(os.environ["MASTER_PORT"]), world, rank_ == 0, timeout_s
            )
        if store is not None:  # every rank on this node
            os.environ.update(loopback_socket_env(backend))
        dist.init_process_group(
            backend=backend,
            rank=rank_,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
            device_id=None if kind == "cpu" else device,
            store=store,
        )
    return kind, device


def all_reduce_sum(values: list[float], device: torch.device | None = None) -> list[float]:
    """Sum floats over ranks (float64 so token counts stay exact)."""
    if not is_dist() or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device or torch.device("cpu"))
    dist.all_reduce(t)
    return t.tolist()


def _entry(
    local_rank: int,
    fn: Callable[..., Any],
    world: int,
    token: str,
    env: dict[str, str],
    args: tuple,
) -> None:
    # the launcher asks a rank that overran spawn's timeout for every thread's stack (to stderr)
    faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)
    os.environ.update(env)
    os.environ.update(
        {
            "RANK": str(local_rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world),
            RENDEZVOUS_ENV: token,
        }
    )
    try:
        fn(local_rank, *args)
    except BaseException:
        # torch.multiprocessing records the error for the launcher, then exits the interpreter;
        # cut that exit short before its teardown destroys the group (below)
        atexit.register(_leave, 1)
        raise
    _leave(0)


def _leave(code: int) -> None:
    """End a spawned rank without destroying its process group or running the interpreter's
    teardown. Destroying a gloo group can deadlock on torch 2.7: the group's destructor, run
    with the GIL held, joins its worker threads, and a worker still freeing the last collective's
    work needs the GIL to release that work's tensor (gdb showed exactly this in a rank of the
    rendezvous test; about one spawn in 20 on 2 loaded cores). Teardown can also abort the
    process ("terminate called without an active exception") when c10d/gloo threads are kept
    alive by lingering references (FSDP2's DeviceMesh holds the group). The ranks' work is done
    and the group's sockets close with the process."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def spawn(
    fn: Callable[..., Any],
    world: int,
    *args: Any,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> None:
    """Run ``fn(rank, *args)`` in ``world`` fresh processes with RANK/WORLD_SIZE/LOCAL_RANK set
    and a fresh node-local rendezvous (torchrun-like, without a port); raises if any rank fails.
    ``fn`` must be importable (module level).

    ``timeout_s``: if the ranks have not all finished by then, each one still running writes the
    stack of every thread to its stderr (faulthandler), is killed, and :class:`TimeoutError`
    names them; ``None`` waits as long as they run."""
    import torch.multiprocessing as mp

    token = new_rendezvous_token()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        context = mp.start_processes(
            _entry, args=(fn, world, token, dict(env or {}), args), nprocs=world, join=False,
            start_method="spawn",
        )  # fmt: skip
        assert context is not None  # join=False returns the context
        while not context.join(None if deadline is None else max(deadline - time.monotonic(), 0)):
            if deadline is not None and time.monotonic() >= deadline:
                stuck = _dump_and_kill(context.processes)
                raise TimeoutError(
                    f"spawn({getattr(fn, '__name__', fn)!r}, world={world}): rank(s) {stuck} "
                    f"still running after {timeout_s:g} s; killed (their stacks are on stderr above)"
                )
    finally:  # ranks leave with os._exit (or die): their store's file may be left behind
        node_local_store_path(token).unlink(missing_ok=True)


def _dump_and_kill(processes: list[Any], grace_s: float = 5.0) -> list[int]:
    """Ask each live process for its stacks, give them ``grace_s`` to write, kill them; the
    ranks (indices) that were alive."""
    stuck = [rank_ for rank_, p in enumerate(processes) if p.is_alive()]
    for rank_ in stuck:
        with contextlib.suppress(ProcessLookupError):
            os.kill(processes[rank_].pid, STACK_DUMP_SIGNAL)
    time.sleep(grace_s)
    for rank_ in stuck:
        processes[rank_].kill()
        processes[rank_].join()
    return stuck
