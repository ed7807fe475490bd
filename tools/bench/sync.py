"""Benchmark of rl_sync weight transfer, as ratios against baselines measured in the same run.

CPU mode (always): a trainer process sends a Qwen2.5-0.5B-shaped bf16 state (1 GB by default) to a
receiver process over a standalone gloo group (rl_sync.transfer), for several bucket sizes; the
receiver verifies checksums and copies into its own "engine" tensors. Reported against
single-threaded memcpy bandwidth of the same state measured in this run (target >= 50%), and
against a raw gloo broadcast of one flat buffer (the transport's ceiling). Next to it, the
same-host colocated path: rl_sync.ipc on CPU (the trainer process packs into a /dev/shm buffer and
broadcasts only the JSON handle; the rollout process maps it, verifies the checksum and copies into
its engine tensors), and its zero-copy variant (IpcSender(num_buffers=2) alternates between two
buffers; IpcReceiver(adopt=True) verifies the same way, then the engine keeps the mapped views as
its tensors instead of copying them).

GPU mode (when CUDA is present): colocated update of the same state through CUDA IPC
(rl_sync.ipc: pack -> handle -> map -> verify -> copy into engine tensors), end-to-end latency
(target <= 50 ms), against device copy bandwidth measured in the same run; NCCL broadcast GB/s
between two GPUs when there are two.

    .venv/bin/python tools/bench/sync.py                    # 1 GB, buckets 16..1024 MB
    .venv/bin/python tools/bench/sync.py --size-gb 0.25 --repeats 2
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch

from rl_sync.group import init_group
from rl_sync.ipc import IpcReceiver, IpcSender
from rl_sync.testing import mp_context, spawn
from rl_sync.transfer import WeightReceiver, WeightSender

# Qwen2.5-0.5B: hidden 896, 24 layers, 14 heads / 2 kv heads (head_dim 64), mlp 4864, vocab 151936
HIDDEN, LAYERS, KV, MLP, VOCAB = 896, 24, 128, 4864, 151936


def qwen05b_shapes(size_gb: float) -> list[tuple[str, tuple[int, ...]]]:
    """Parameter shapes of Qwen2.5-0.5B (tied embeddings, ~0.99 GB bf16), scaled to ``size_gb``."""
    layer = [
        ("self_attn.q_proj.weight", (HIDDEN, HIDDEN)),
        ("self_attn.q_proj.bias", (HIDDEN,)),
        ("self_attn.k_proj.weight", (KV, HIDDEN)),
        ("self_attn.k_proj.bias", (KV,)),
        ("self_attn.v_proj.weight", (KV, HIDDEN)),
        ("self_attn.v_proj.bias", (KV,)),
        ("self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
        ("mlp.gate_proj.weight", (MLP, HIDDEN)),
        ("mlp.up_proj.weight", (MLP, HIDDEN)),
        ("mlp.down_proj.weight", (HIDDEN, MLP)),
        ("input_layernorm.weight", (HIDDEN,)),
        ("post_attention_layernorm.weight", (HIDDEN,)),
    ]
    full_bytes = 2 * (VOCAB * HIDDEN + HIDDEN + LAYERS * sum(_numel(s) for _, s in layer))
    fraction = min(1.0, size_gb * 1e9 / full_bytes)
    layers = max(1, round(LAYERS * fraction))
    vocab = max(1024, int(VOCAB * fraction))
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, HIDDEN))]
    for i in range(layers):
        shapes += [(f"model.layers.{i}.{name}", shape) for name, shape in layer]
    shapes.append(("model.norm.weight", (HIDDEN,)))
    return shapes


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def make_state(
    shapes: list[tuple[str, tuple[int, ...]]], device: str = "cpu"
) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator(device=device).manual_seed(0)
    return [
        (
            name,
            torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(
                torch.bfloat16
            ),
        )
        for name, shape in shapes
    ]


def memcpy_gbps(nbytes: int, device: str = "cpu", repeats: int = 3) -> float:
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault pages in
    best = float("inf")
    for _ in range(repeats):
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


# --------------------------------------------------------------------------------------------------
# CPU: gloo between two processes
# --------------------------------------------------------------------------------------------------
def _cpu_receiver(
    port_queue: Any, results: Any, shapes: list, schedule: list, threads: int
) -> None:
    torch.set_num_threads(threads)
    group = init_group("127.0.0.1", port_queue.get(timeout=120), 1, 2, timeout_s=600)
    engine = {name: torch.empty(shape, dtype=torch.bfloat16) for name, shape in shapes}
    receiver = WeightReceiver(group)

    def apply(named: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named:
            engine[name].copy_(tensor)

    adopted: dict[str, torch.Tensor] = {}

    def adopt(named: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named:
            adopted[name] = tensor  # the engine's weights become views of the shared buffer

    ipc_receiver = IpcReceiver("cpu")
    adopt_receiver = IpcReceiver("cpu", adopt=True)
    for kind, size in schedule:
        if kind in ("shm", "adopt"):
            if kind == "shm":
                metrics = ipc_receiver.receive_over(group, apply)
            else:
                metrics = adopt_receiver.receive_over(group, adopt)
            results.put(("recv", metrics.seconds, metrics.num_buckets))
            group.barrier()
            continue
        if kind == "raw":
            buf = torch.empty(size, dtype=torch.uint8)
            group.barrier()
            group.broadcast(buf, 0)
            group.barrier()
            continue
        metrics = receiver.receive(apply)
        results.put(("recv", metrics.seconds, metrics.num_buckets))
        group.barrier()
    group.close()


def run_cpu(args: argparse.Namespace) -> list[dict[str, Any]]:
    torch.set_num_threads(args.threads)
    shapes = qwen05b_shapes(args.size_gb)
    state = make_state(shapes)
    nbytes = sum(t.numel() * t.element_size() for _, t in state)
    buckets_mb = [int(b) for b in args.buckets_mb.split(",")]
    schedule: list[tuple[str, int]] = [("raw", nbytes)] * args.repeats
    for bucket_mb in buckets_mb:
        schedule += [("sync", bucket_mb)] * (args.repeats + 1)  # first one warms up
    schedule += [("shm", 0)] * (args.repeats + 1)
    schedule += [("adopt", 0)] * (args.repeats + 2)  # the first two fault in the two buffers
    memcpy = memcpy_gbps(nbytes)
    ctx = mp_context()
    port_queue, results = ctx.Queue(), ctx.Queue()
    child = spawn(_cpu_receiver, port_queue, results, shapes, schedule, args.threads)
    group = init_group("127.0.0.1", 0, 0, 2, timeout_s=600, on_port=port_queue.put)
    rows: list[dict[str, Any]] = []
    raw_times = []
    for _ in range(args.repeats):
        buf = torch.ones(nbytes, dtype=torch.uint8)
        group.barrier()
        start = time.perf_counter()
        group.broadcast(buf, 0)
        group.barrier()
        raw_times.append(time.perf_counter() - start)
    raw = nbytes / min(raw_times) / 1e9
    rows.append(
        {"mode": "gloo raw broadcast (1 flat buffer)", "bucket_mb": "-", "gbps": raw, "buckets": 1}
    )
    for bucket_mb in buckets_mb:
        sender = WeightSender(group, bucket_mb << 20)
        times, recv_times, num_buckets = [], [], 0
        for i in range(args.repeats + 1):
            start = time.perf_counter()
            metrics = sender.send(state, version=len(rows) * 100 + i + 1)
            _, recv_seconds, num_buckets = results.get(timeout=600)
            group.barrier()
            if i:
                times.append(metrics.seconds)
                recv_times.append(recv_seconds)
            del start
        rows.append(
            {
                "mode": "WeightSender -> WeightReceiver",
                "bucket_mb": bucket_mb,
                "gbps": nbytes / min(times) / 1e9,
                "recv_gbps": nbytes / min(recv_times) / 1e9,
                "buckets": num_buckets,
            }
        )
    ipc_sender = IpcSender("cpu")
    times, recv_times = [], []
    for i in range(args.repeats + 1):  # the first one creates and faults in the shared buffer
        metrics = ipc_sender.send_over(group, state, version=i + 1)
        _, recv_seconds, _ = results.get(timeout=600)
        group.barrier()
        if i:
            times.append(metrics.seconds)
            recv_times.append(recv_seconds)
    ipc_sender.close()
    rows.append(
        {
            "mode": "IpcSender -> IpcReceiver (/dev/shm)",
            "bucket_mb": "-",
            "gbps": nbytes / min(times) / 1e9,
            "recv_gbps": nbytes / min(recv_times) / 1e9,
            "buckets": 1,
        }
    )
    adopt_sender = IpcSender("cpu", num_buffers=2)
    times, recv_times = [], []
    for i in range(args.repeats + 2):  # the first two create and fault in the two buffers
        metrics = adopt_sender.send_over(group, state, version=i + 1)
        _, recv_seconds, _ = results.get(timeout=600)  # the receiver adopted version i + 1
        group.barrier()
        if i > 1:
            times.append(metrics.seconds)
            recv_times.append(recv_seconds)
    adopt_sender.close()
    rows.append(
        {
            "mode": "IpcSender -> IpcReceiver (adopt, 2 buffers)",
            "bucket_mb": "-",
            "gbps": nbytes / min(times) / 1e9,
            "recv_gbps": nbytes / min(recv_times) / 1e9,
            "buckets": 1,
        }
    )
    group.close()
    child.join(timeout=60)
    print(
        f"\nCPU: {nbytes / 1e9:.2f} GB bf16 state ({len(shapes)} tensors, Qwen2.5-0.5B shapes), "
        f"{args.threads} thread(s), best of {args.repeats}; memcpy {memcpy:.2f} GB/s"
    )
    print(
        "GB/s: sender's view (pack + checksum + send, until every receiver verified); "
        "recv+apply: receiver's clock (from waiting for the sync to the end of apply: the copy into its engine tensors, or adopting the views)"
    )
    print(
        f"| {'path':43} | {'bucket MB':>9} | {'buckets':>7} | {'GB/s':>6} | {'x memcpy':>8} | {'recv+apply GB/s':>15} |"
    )
    print(f"|{'-' * 45}|{'-' * 11}|{'-' * 9}|{'-' * 8}|{'-' * 10}|{'-' * 17}|")
    for row in rows:
        recv = f"{row['recv_gbps']:.2f}" if "recv_gbps" in row else "-"
        print(
            f"| {row['mode']:43} | {row['bucket_mb']!s:>9} | {row['buckets']:>7} | {row['gbps']:6.2f} | "
            f"{row['gbps'] / memcpy:8.2f} | {recv:>15} |"
        )
    return rows


# --------------------------------------------------------------------------------------------------
# GPU: colocated CUDA IPC
# --------------------------------------------------------------------------------------------------
def _gpu_receiver(port_queue: Any, results: Any, shapes: list, repeats: int) -> None:
    torch.cuda.set_device(0)
    # the handle is control data: gloo, like the sender (NCCL refuses two ranks on one GPU)
    group = init_group(
        "127.0.0.1", port_queue.get(timeout=120), 1, 2, backend="gloo", timeout_s=600
    )
    engine = {
        name: torch.empty(shape, dtype=torch.bfloat16, device="cuda") for name, shape in shapes
    }
    adopted: dict[str, torch.Tensor] = {}

    def apply(named: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named:
            engine[name].copy_(tensor)
        torch.cuda.synchronize()

    def adopt(named: list[tuple[str, torch.Tensor]]) -> None:
        adopted.update(named)  # the engine's weights become views of the trainer's buffer

    for receiver, fn in (
        (IpcReceiver("cuda:0"), apply),
        (IpcReceiver("cuda:0", adopt=True), adopt),
    ):
        for _ in range(repeats + 1):
            metrics = receiver.receive_over(group, fn)
            results.put(("recv", metrics.seconds))
            group.barrier()
    group.close()


def run_gpu(args: argparse.Namespace) -> None:
    torch.cuda.set_device(0)
    shapes = qwen05b_shapes(args.size_gb)
    state = make_state(shapes, device="cuda")
    nbytes = sum(t.numel() * t.element_size() for _, t in state)
    copy = memcpy_gbps(nbytes, device="cuda")
    ctx = mp_context()
    port_queue, results = ctx.Queue(), ctx.Queue()
    child = spawn(_gpu_receiver, port_queue, results, shapes, args.repeats)
    group = init_group("127.0.0.1", 0, 0, 2, timeout_s=600, on_port=port_queue.put, backend="gloo")
    copy_ms = nbytes / copy / 1e6
    print(
        f"\nGPU ({torch.cuda.get_device_name(0)}): {nbytes / 1e9:.2f} GB bf16 state; device-to-device "
        f"copy of the same bytes {copy_ms:.2f} ms ({copy:.0f} GB/s)"
    )
    print("| path | ms end-to-end | GB/s | x device copy time | receiver ms (map+verify+apply) |")
    print("|---|---|---|---|---|")
    version = 0
    for label, sender in (
        ("colocated CUDA IPC (pack, handle, verify, copy into engine)", IpcSender("cuda:0")),
        (
            "colocated CUDA IPC, zero-copy adopt (pack, handle, verify)",
            IpcSender("cuda:0", num_buffers=2),
        ),
    ):
        totals, recvs = [], []
        for i in range(args.repeats + 1):
            version += 1
            torch.cuda.synchronize()
            start = time.perf_counter()
            sender.send_over(group, state, version=version)
            _, recv_seconds = results.get(timeout=600)
            group.barrier()
            if i:
                totals.append(time.perf_counter() - start)
                recvs.append(recv_seconds)
        best = min(totals)
        print(
            f"| {label} | {best * 1e3:.1f} | {nbytes / best / 1e9:.0f} | "
            f"{best * 1e3 / copy_ms:.1f} | {min(recvs) * 1e3:.1f} |"
        )
        print(f"target <= 50 ms: {'met' if best <= 0.05 else 'NOT met'}")
    group.close()
    child.join(timeout=60)
    if torch.cuda.device_count() < 2:
        print("NCCL broadcast: skipped (needs two GPUs; NCCL refuses two ranks on one device)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--buckets-mb", default="16,64,256,1024")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-cpu", action="store_true")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None, help="cuda: GPU only")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if args.device == "cuda":
        args.skip_cpu = True
    if not args.skip_cpu:
        run_cpu(args)
    if torch.cuda.is_available():
        run_gpu(args)
    else:
        print("\nGPU mode skipped: no CUDA device")


if __name__ == "__main__":
    main()
