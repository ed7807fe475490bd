"""Process-group setup from the usual env vars (RANK, WORLD_SIZE, MASTER_ADDR/PORT, LOCAL_RANK),
with the collective backend chosen by rl_sync.device, and a small multi-process launcher."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rl_sync.device import DeviceKind, backend_for, detect_device_kind, set_device
from rl_sync.store import create_store, is_loopback_host, loopback_interface


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
    kind: DeviceKind | None = None, *, timeout_s: float = 600.0
) -> tuple[DeviceKind, torch.device]:
    """Initialise the default process group from env vars when WORLD_SIZE is set (idempotent).

    Returns the device kind and this rank's device. Without WORLD_SIZE this is a single process
    and no group is created. A loopback MASTER_ADDR (single-node runs) keeps every listener of
    the group on loopback: the rendezvous store (see :func:`rl_sync.store.create_store`) and, for
    gloo, its pairs (``GLOO_SOCKET_IFNAME`` set to the loopback interface unless already set).
    """
    kind = kind or detect_device_kind()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = set_device(local_rank, kind)
    if not is_dist() and "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) >= 1:
        rank_, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        backend = backend_for(kind)
        store = None
        master = os.environ.get("MASTER_ADDR", "")
        if is_loopback_host(master):
            store = create_store(
                master, int(os.environ["MASTER_PORT"]), world, rank_ == 0, timeout_s
            )
            lo = loopback_interface()
            if backend == "gloo" and lo is not None:
                os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
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


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(
    local_rank: int, fn: Callable[..., Any], world: int, port: int, env: dict[str, str], args: tuple
) -> None:
    os.environ.update(env)
    os.environ.update(
        {
            "RANK": str(local_rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    try:
        fn(local_rank, *args)
    finally:
        if is_dist():
            dist.destroy_process_group()
    # Success: leave without interpreter teardown. c10d/gloo threads kept alive by lingering
    # references (FSDP2's DeviceMesh holds the group) can otherwise abort the process at exit
    # ("terminate called without an active exception") after the work is done. A failure above
    # propagates normally, so torch.multiprocessing still reports it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(
    fn: Callable[..., Any], world: int, *args: Any, env: dict[str, str] | None = None
) -> None:
    """Run ``fn(rank, *args)`` in ``world`` fresh processes with RANK/WORLD_SIZE/MASTER_* set
    (torchrun-like); raises if any rank fails. ``fn`` must be importable (module level)."""
    import torch.multiprocessing as mp

    mp.spawn(_entry, args=(fn, world, free_port(), dict(env or {}), args), nprocs=world, join=True)
