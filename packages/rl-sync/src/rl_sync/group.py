"""Process groups among separately started processes (trainer ranks and engine workers).

Trainer ranks already live in their own default world (``torch.distributed.init_process_group``) and
engine workers in theirs, so the weight-sync group must not touch the default group. This module
builds a standalone communicator: a ``TCPStore`` hosted by rank 0 (listening on loopback only when
the address is loopback, 127.0.0.1 by default: :mod:`rl_sync.store`), and the device's collective backend (gloo / nccl / hccl, chosen by
:mod:`rl_sync.device`) constructed directly on a prefixed view of that store. Nothing is registered
in ``torch.distributed``'s global state, so any number of such groups coexist with a default world.

Every collective carries a timeout and waits with it; a peer that dies or stalls turns into a
:class:`CollectiveTimeoutError` naming the operation, the group and the timeout, never a hang.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
from torch._C._distributed_c10d import (
    AllreduceOptions,
    BarrierOptions,
    BroadcastOptions,
    PrefixStore,
    ProcessGroupGloo,
    ReduceOp,
    Store,
)

from rl_sync.device import BackendName, DeviceKind, backend_for, detect_device_kind, torch_device
from rl_sync.store import create_store, is_loopback_host, loopback_socket_env

DEFAULT_HOST = "127.0.0.1"
DEFAULT_TIMEOUT_S = 600.0


class CommError(RuntimeError):
    """A collective of a sync group failed (peer gone, connection reset, bad rendezvous)."""


class CollectiveTimeoutError(CommError, TimeoutError):
    """A collective of a sync group did not complete within its timeout."""


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port that was free on ``host`` a moment ago (bind to port 0 and release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _make_backend(
    backend: BackendName,
    store: Store,
    rank: int,
    world_size: int,
    timeout: timedelta,
    host: str,
    local_addr: str | None = None,
) -> Any:
    if backend == "gloo":
        options = ProcessGroupGloo._Options()
        options._timeout = timeout
        # This rank's pairs listen on `local_addr` (its own node's address in a multi-node group).
        # Else a loopback rendezvous means every rank is on this host: pin gloo to the loopback
        # interface instead of resolving the hostname (which may point at an unreachable address,
        # e.g. Debian's 127.0.1.1 for the hostname).
        hostname = local_addr or (DEFAULT_HOST if is_loopback_host(host) else "")
        options._devices = [ProcessGroupGloo.create_device(hostname=hostname)]
        return ProcessGroupGloo(store, rank, world_size, options)
    if is_loopback_host(host):
        # every rank is on this host: NCCL's/HCCL's bootstrap sockets listen on loopback, not on
        # the first external interface (gloo's device is pinned above, not through the env)
        os.environ.update(loopback_socket_env(backend))
    if backend == "nccl":
        from torch._C._distributed_c10d import ProcessGroupNCCL

        nccl_options = ProcessGroupNCCL.Options()
        nccl_options._timeout = timeout
        nccl_options.is_high_priority_stream = False
        return ProcessGroupNCCL(store, rank, world_size, nccl_options)
    if backend == "hccl":  # pragma: no cover - needs an Ascend NPU
        from torch_npu._C._distributed_c10d import ProcessGroupHCCL  # type: ignore[import-not-found]

        hccl_options = ProcessGroupHCCL.Options()
        hccl_options._timeout = timeout
        return ProcessGroupHCCL(store, rank, world_size, hccl_options)
    raise ValueError(f"unknown backend {backend!r}; expected gloo, nccl or hccl")


@dataclass
class CommGroup:
    """A standalone communicator among ``world_size`` processes (not part of the default world).

    Tensors passed to collectives must live on :attr:`device` (cpu for gloo).
    """

    name: str
    rank: int
    world_size: int
    backend: BackendName
    device: torch.device
    timeout_s: float
    host: str
    port: int
    store: Store = field(repr=False)
    _backend: Any = field(repr=False)
    _closed: bool = field(default=False, repr=False)

    # -- waiting ------------------------------------------------------------------------------
    def _wait(self, work: Any, op: str, timeout_s: float) -> None:
        start = time.monotonic()
        try:
            completed = work.wait(timedelta(seconds=timeout_s))
        except Exception as exc:
            elapsed = time.monotonic() - start
            is_timeout = "timeout" in str(exc).lower() or "timed out" in str(exc).lower()
            cls = CollectiveTimeoutError if is_timeout else CommError
            raise cls(
                f"{op} in sync group {self.name!r} (rank {self.rank}/{self.world_size}, "
                f"{self.backend}) failed after {elapsed:.1f}s (timeout {timeout_s:.1f}s): {exc}"
            ) from exc
        if completed is False:
            raise CollectiveTimeoutError(
                f"{op} in sync group {self.name!r} (rank {self.rank}/{self.world_size}, "
                f"{self.backend}) did not complete within {timeout_s:.1f}s"
            )

    def _check_open(self) -> None:
        if self._closed:
            raise CommError(f"sync group {self.name!r} is closed")

    def _timeout(self, timeout_s: float | None) -> float:
        return self.timeout_s if timeout_s is None else float(timeout_s)

    # -- collectives ----------------------------------------------------------------------------
    def broadcast(self, tensor: torch.Tensor, src: int, timeout_s: float | None = None) -> None:
        """Broadcast ``tensor`` in place from rank ``src`` to every rank (blocking)."""
        self.broadcast_async(tensor, src, timeout_s).wait()

    def broadcast_async(
        self, tensor: torch.Tensor, src: int, timeout_s: float | None = None
    ) -> PendingOp:
        """Start a broadcast and return at once; ``.wait()`` it (with the same timeout) before
        touching ``tensor`` again. Collectives run in the order they were started."""
        self._check_open()
        seconds = self._timeout(timeout_s)
        options = BroadcastOptions()
        options.rootRank = src
        options.rootTensor = 0
        options.timeout = timedelta(seconds=seconds)
        work = self._backend.broadcast([tensor], options)
        op = f"broadcast of {tensor.numel() * tensor.element_size()} bytes from {src}"
        return PendingOp(self, work, op, seconds, (tensor,))

    def all_reduce(
        self, tensor: torch.Tensor, op: str = "sum", timeout_s: float | None = None
    ) -> None:
        """In-place all-reduce (``op``: sum, max, min) over every rank (blocking)."""
        self._check_open()
        seconds = self._timeout(timeout_s)
        reduce_ops = {"sum": ReduceOp.SUM, "max": ReduceOp.MAX, "min": ReduceOp.MIN}
        if op not in reduce_ops:
            raise ValueError(f"unknown reduce op {op!r}; expected one of {sorted(reduce_ops)}")
        options = AllreduceOptions()
        options.reduceOp = reduce_ops[op]
        options.timeout = timedelta(seconds=seconds)
        work = self._backend.allreduce([tensor], options)
        self._wait(work, f"all_reduce({op})", seconds)

    def barrier(self, timeout_s: float | None = None) -> None:
        """Block until every rank reached the barrier."""
        self._check_open()
        seconds = self._timeout(timeout_s)
        if self.backend == "gloo":
            options = BarrierOptions()
            options.timeout = timedelta(seconds=seconds)
            self._wait(self._backend.barrier(options), "barrier", seconds)
        else:  # device backends: a one-element all-reduce is a barrier that needs no device ids
            self.all_reduce(torch.zeros(1, device=self.device), "sum", seconds)

    def close(self) -> None:
        """Release the communicator (idempotent). Peers still waiting on it get an error."""
        if self._closed:
            return
        self._closed = True
        for method in ("shutdown", "abort"):
            fn = getattr(self._backend, method, None)
            if fn is not None:
                try:
                    fn()
                    break
                except Exception:  # shutdown is best effort: the group is unusable either way
                    continue
        # Destroy the communicator and (on rank 0) the TCPStore server now, while the interpreter
        # is whole: left to interpreter teardown, their C++ threads can outlive their owners and
        # abort the process ("terminate called without an active exception").
        self._backend = None
        self.store = None  # type: ignore[assignment]

    def __enter__(self) -> CommGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class PendingOp:
    """A started collective: ``wait()`` blocks until it is done (raising like the blocking call).

    Keeps its tensors alive until then."""

    group: CommGroup
    work: Any
    op: str
    timeout_s: float
    tensors: tuple[torch.Tensor, ...] = ()
    done: bool = False

    def wait(self) -> None:
        if not self.done:
            self.group._wait(self.work, self.op, self.timeout_s)
            self.done = True
            self.tensors = ()


def init_group(
    host: str = DEFAULT_HOST,
    port: int = 0,
    rank: int = 0,
    world_size: int = 2,
    backend: BackendName | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    device_kind: DeviceKind | None = None,
    local_rank: int = 0,
    name: str = "weight_sync",
    on_port: Callable[[int], None] | None = None,
    local_addr: str | None = None,
    listener: socket.socket | None = None,
) -> CommGroup:
    """Join (rank > 0) or host (rank 0) a standalone group of ``world_size`` processes.

    Rank 0 binds a ``TCPStore`` on ``host:port`` (on ``host`` alone when it is loopback); ``port=0`` picks a free port, which rank 0 hands
    to ``on_port(port)`` right after binding (before waiting for the others) so the caller can
    publish it. The other ranks connect to it. The backend defaults to the device
    kind's (cpu -> gloo, cuda -> nccl, npu -> hccl); ``timeout_s`` bounds the rendezvous and is the
    default timeout of every collective. The default ``torch.distributed`` world is not touched.
    ``local_addr`` (gloo): the address this rank's own connections listen on, which the other
    ranks must reach, i.e. this rank's node address when the group spans nodes; unset: loopback
    when ``host`` is loopback, else the address the hostname resolves to. ``listener`` (rank 0):
    the store's socket, bound and listening since before ``port`` was published
    (:func:`rl_sync.store.bind_listener`); without it, a ``port`` found free earlier
    (:func:`free_port`) may have been taken by another process in between.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if rank > 0 and port == 0:
        raise ValueError("port=0 (pick a free port) is only valid on rank 0, which hosts the store")
    kind = detect_device_kind() if device_kind is None else device_kind
    chosen: BackendName = backend_for(kind) if backend is None else backend
    if chosen == "gloo":
        kind = "cpu"
    timeout = timedelta(seconds=timeout_s)
    try:  # the backend's rendezvous below waits for every rank
        store = create_store(host, port, world_size, rank == 0, timeout_s, listener=listener)
    except Exception as exc:
        role = "host" if rank == 0 else "reach"
        raise CommError(
            f"rank {rank}/{world_size} could not {role} the TCPStore of sync group {name!r} at "
            f"{host}:{port} within {timeout_s:.1f}s: {exc}"
        ) from exc
    actual_port = int(store.port)
    if rank == 0 and on_port is not None:
        on_port(actual_port)
    prefixed = PrefixStore(f"rl_sync/{name}/", store)
    try:
        comm = _make_backend(chosen, prefixed, rank, world_size, timeout, host, local_addr)
    except Exception as exc:
        raise CommError(
            f"rank {rank}/{world_size} could not create the {chosen} communicator of sync group "
            f"{name!r} at {host}:{actual_port}: {exc}"
        ) from exc
    return CommGroup(
        name=name,
        rank=rank,
        world_size=world_size,
        backend=chosen,
        device=torch_device(kind, local_rank),
        timeout_s=float(timeout_s),
        host=host,
        port=actual_port,
        store=store,
        _backend=comm,
    )


__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_TIMEOUT_S",
    "CollectiveTimeoutError",
    "CommError",
    "CommGroup",
    "PendingOp",
    "free_port",
    "init_group",
]
