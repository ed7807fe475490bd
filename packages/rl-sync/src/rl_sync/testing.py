"""Process entry points and fixtures for exercising weight sync between real processes.

Used by rl-sync's tests, the benchmark and cross-package tests. Entry points are module-level so a
``spawn`` multiprocessing context can import them in a fresh interpreter.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from rl_sync.buckets import BucketSpec
from rl_sync.group import CommGroup, PendingOp, free_port, init_group
from rl_sync.transfer import WeightReceiver, WeightSender


def make_named_tensors(seed: int = 0, scale: int = 1) -> list[tuple[str, torch.Tensor]]:
    """A deterministic mix of dtypes and shapes (bf16, fp16, fp32, fp64, int, bool, fp8, scalar)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    tensors = [
        ("model.embed_tokens.weight", randn(64 * scale, 32).to(torch.bfloat16)),
        ("model.layers.0.self_attn.q_proj.weight", randn(32, 32).to(torch.bfloat16)),
        ("model.layers.0.self_attn.q_proj.bias", randn(33).to(torch.bfloat16)),  # odd byte count
        ("model.layers.0.mlp.up_proj.weight", randn(48, 32 * scale).to(torch.float16)),
        ("model.layers.0.input_layernorm.weight", randn(32)),
        ("model.layers.0.scale", randn(1).squeeze(0).double()),  # 0-dim
        ("model.rotary.inv_freq", randn(7, 3).t()),  # non-contiguous
        ("model.norm.weight", randn(31).to(torch.float8_e4m3fn)),
        ("buffers.position_ids", torch.arange(17 * scale, dtype=torch.int64)),
        (
            "buffers.counts",
            torch.randint(-(2**31), 2**31 - 1, (9,), generator=gen, dtype=torch.int32),
        ),
        ("buffers.mask", torch.rand(13, generator=gen) > 0.5),
        ("lm_head.weight", randn(64 * scale, 32).to(torch.bfloat16)),
    ]
    # NaN/inf payloads must survive bit for bit too
    tensors[4][1][:3] = torch.tensor([float("nan"), float("inf"), -0.0])
    return tensors


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (NaN-safe)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a_bytes = a.contiguous().reshape(-1).view(torch.uint8)
    b_bytes = b.contiguous().reshape(-1).view(torch.uint8)
    return torch.equal(a_bytes, b_bytes)


class CorruptingSender(WeightSender):
    """A sender whose ``corrupt_bucket``-th bucket has one byte flipped after its checksum."""

    def __init__(self, *args: Any, corrupt_bucket: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.corrupt_bucket = corrupt_bucket

    def _transmit(self, version: int, spec: BucketSpec, payload: torch.Tensor) -> list[PendingOp]:
        if spec.index == self.corrupt_bucket:
            payload = payload.clone()
            payload[payload.numel() // 2] ^= 0x10
        return super()._transmit(version, spec, payload)


def _die_after_broadcasts(group: CommGroup, count: int, how: str) -> None:
    """Make this process die (SIGKILL) or freeze (SIGSTOP) on its ``count``-th broadcast."""
    original = group.broadcast_async  # every broadcast (blocking or not) starts here
    calls = {"n": 0}

    def broadcast_async(
        tensor: torch.Tensor, src: int, timeout_s: float | None = None
    ) -> PendingOp:
        calls["n"] += 1
        if calls["n"] == count:
            os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        return original(tensor, src, timeout_s)

    group.broadcast_async = broadcast_async  # type: ignore[method-assign]


def receiver_main(
    port_queue: Any,
    result_queue: Any,
    *,
    out_path: str | None = None,
    timeout_s: float = 30.0,
    syncs: list[dict[str, Any]] | None = None,
    fault: tuple[str, int] | None = None,
) -> None:
    """Join a sync group as rank 1 and receive ``syncs`` (each: expected_version, last_version).

    Reports ``("ok", version, names)`` or ``("error", type name, message)`` per sync on
    ``result_queue``; with ``out_path`` the applied tensors of the last accepted sync are saved
    (torch.save; load with weights_only=True).
    """
    torch.set_num_threads(1)
    try:
        port = port_queue.get(timeout=timeout_s)
        group = init_group("127.0.0.1", port, 1, 2, timeout_s=timeout_s)
        if fault is not None:
            _die_after_broadcasts(group, fault[1], fault[0])
        receiver = WeightReceiver(group)
        for sync in syncs or [{}]:
            if "last_version" in sync:
                receiver.last_version = sync["last_version"]
            applied: list[tuple[str, torch.Tensor]] = []

            def apply(named: list[tuple[str, torch.Tensor]], sink: list = applied) -> None:
                sink.extend((name, tensor.clone()) for name, tensor in named)

            try:
                metrics = receiver.receive(apply, expected_version=sync.get("expected_version"))
            except Exception as exc:
                result_queue.put(("error", type(exc).__name__, str(exc), len(applied)))
                continue
            if out_path is not None:
                torch.save(dict(applied), out_path)
            result_queue.put(
                ("ok", metrics.version, [name for name, _ in applied], metrics.num_buckets)
            )
        group.close()
    except Exception:
        result_queue.put(("crash", traceback.format_exc()))


def trainer_main(
    rank: int,
    world_size: int,
    rendezvous_token: str,
    port_queue: Any,
    result_queue: Any,
    *,
    seed: int = 0,
    versions: list[int] | None = None,
    bucket_bytes: int = 1 << 10,
    timeout_s: float = 30.0,
    corrupt_bucket: int | None = None,
) -> None:
    """A trainer rank: its default world (gloo) holds a flat shard of every tensor; rank 0 also
    hosts a sync group with one receiver and sends the all-gathered full tensors. The default
    world meets in the node-local store of ``rendezvous_token`` (rl_sync.store)."""
    import torch.distributed as dist

    from rl_sync.store import node_local_store

    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            store=node_local_store(rendezvous_token, world_size),
            rank=rank,
            world_size=world_size,
        )
        full = make_named_tensors(seed)
        shards = [(name, _shard(t, rank, world_size)) for name, t in full]
        group = None
        if rank == 0:
            group = init_group("127.0.0.1", 0, 0, 2, timeout_s=timeout_s, on_port=port_queue.put)
        for version in versions or [1]:
            gathered = [
                (name, _gather_full(shard, ref)) for (name, shard), (_, ref) in zip(shards, full)
            ]
            if group is not None:
                sender: WeightSender
                if corrupt_bucket is not None:
                    sender = CorruptingSender(
                        group, bucket_bytes, corrupt_bucket=corrupt_bucket, timeout_s=timeout_s
                    )
                else:
                    sender = WeightSender(group, bucket_bytes, timeout_s=timeout_s)
                start = time.monotonic()
                try:
                    metrics = sender.send(gathered, version)
                    result_queue.put(("ok", metrics.version, metrics.num_buckets, metrics.bytes))
                except Exception as exc:
                    result_queue.put(
                        ("error", type(exc).__name__, str(exc), time.monotonic() - start)
                    )
            dist.barrier()  # the default world still works next to the sync group
        if group is not None:
            group.close()
        dist.destroy_process_group()
    except Exception:
        result_queue.put(("crash", traceback.format_exc()))


def store_rank_main(rank: int, world_size: int, token: str, result_queue: Any) -> None:
    """A rank of a gloo default world that meets in :func:`rl_sync.store.node_local_store`
    (under umask 022, the common default): puts ``("ok", rank, all_reduce(rank + 1), mode of the
    store file while the group lives)`` on the queue, then leaves the group."""
    import stat

    import torch.distributed as dist

    from rl_sync.store import node_local_store, node_local_store_path

    torch.set_num_threads(1)
    os.umask(0o022)
    try:
        store = node_local_store(token, world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        mode = stat.S_IMODE(os.stat(node_local_store_path(token)).st_mode)
        result_queue.put(("ok", rank, float(value.item()), mode))
        dist.destroy_process_group()
    except Exception:
        result_queue.put(("crash", traceback.format_exc()))


_LAUNCHER = """
import time
from rl_sync.store import new_rendezvous_token, node_local_store
token = new_rendezvous_token()
store = node_local_store(token, 2)  # the file the ranks meet in; the other rank never comes
print(token, flush=True)
time.sleep(120)
"""


def killed_launchers_store(tmpdir: str | os.PathLike[str]) -> str:
    """Start a launcher process that makes a node-local store file in ``tmpdir`` (its temp
    dir), SIGKILL it before it can remove the file, and reap it (a zombie's pid would still be
    alive); the file's name, which is left in ``tmpdir``."""
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "TMPDIR": str(tmpdir)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _LAUNCHER], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        token = proc.stdout.readline().strip()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    name = f"rl-rendezvous-{token}"
    if not (Path(tmpdir) / name).is_file():
        raise RuntimeError(f"the launcher left no store file {name!r} in {tmpdir}")
    return name


def _shard(tensor: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    flat = tensor.contiguous().reshape(-1)
    per = -(-flat.numel() // world_size)
    shard = torch.zeros(per, dtype=tensor.dtype)
    part = flat[rank * per : (rank + 1) * per]
    shard[: part.numel()] = part
    return shard


def _gather_full(shard: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """All-gather flat shards over the default group (as bytes: gloo lacks some dtypes)."""
    import torch.distributed as dist

    world = dist.get_world_size()
    shard_bytes = shard.view(torch.uint8)
    parts = [torch.empty_like(shard_bytes) for _ in range(world)]
    dist.all_gather(parts, shard_bytes)
    flat = torch.cat(parts).view(like.dtype)[: like.numel()]
    return flat.view(like.shape)


def mp_context() -> Any:
    """A ``forkserver`` context whose server has torch and rl_sync preloaded.

    Children fork from that clean server process (no threads, no process groups), so they start in
    milliseconds instead of re-importing torch, without the hazards of forking the caller.
    """
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "rl_sync.testing"])
    return ctx


def spawn(target: Callable[..., None], *args: Any, **kwargs: Any) -> Any:
    """Start ``target(*args, **kwargs)`` in a fresh process of :func:`mp_context`."""
    process = mp_context().Process(target=target, args=args, kwargs=kwargs, daemon=True)
    process.start()
    return process


__all__ = [
    "CorruptingSender",
    "bitwise_equal",
    "free_port",
    "ipc_receiver_main",
    "make_named_tensors",
    "mp_context",
    "receiver_main",
    "spawn",
    "store_rank_main",
    "trainer_main",
]


def ipc_receiver_main(
    port_queue: Any,
    result_queue: Any,
    *,
    out_dir: str,
    syncs: int = 1,
    timeout_s: float = 30.0,
    device: str | None = None,
) -> None:
    """Rank 1 of a sync group receiving ``syncs`` colocated (IPC) updates over it.

    Saves each applied state (on the CPU) to ``out_dir/v{version}.pt`` and reports
    ``("ok", version)`` or ``("error", type name, message)``. With ``device`` (e.g. ``"cuda:0"``)
    the buffers are mapped on that device, the group stays gloo (handles are control data) and
    the report is ``("ok", version, device types of the mapped views)``.
    """
    from rl_sync.ipc import IpcReceiver

    torch.set_num_threads(1)
    try:
        if device is not None and device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        group = init_group(
            "127.0.0.1",
            port_queue.get(timeout=timeout_s),
            1,
            2,
            timeout_s=timeout_s,
            backend="gloo" if device is not None else None,
        )
        receiver = IpcReceiver(device)
        for _ in range(syncs):
            state: dict[str, torch.Tensor] = {}
            kinds: set[str] = set()

            def apply(
                named: list[tuple[str, torch.Tensor]], sink: dict = state, seen: set = kinds
            ) -> None:
                sink.update((name, tensor.to("cpu", copy=True)) for name, tensor in named)
                seen.update(tensor.device.type for _, tensor in named)

            try:
                metrics = receiver.receive_over(group, apply)
            except Exception as exc:
                result_queue.put(("error", type(exc).__name__, str(exc)))
                continue
            torch.save(state, os.path.join(out_dir, f"v{metrics.version}.pt"))
            if device is None:
                result_queue.put(("ok", metrics.version))
            else:
                result_queue.put(("ok", metrics.version, sorted(kinds)))
        group.close()
    except Exception:
        result_queue.put(("crash", traceback.format_exc()))
