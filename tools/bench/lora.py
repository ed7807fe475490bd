"""LoRA against full fine-tuning on the benchmark Qwen2 shape (Qwen2.5-0.5B's, random init, no
download: tools/bench/train.py's QWEN05B_SHAPE), measured in one run.

    .venv/bin/python tools/bench/lora.py                      # CPU, fp32, the 24-layer shape
    .venv/bin/python tools/bench/lora.py --layers 2 --steps 1 # quick
    .venv/bin/python tools/bench/lora.py --layers 1 --vocab 8192 --steps 1  # a smoke run
    python tools/bench/lora.py --device cuda --dtype bf16     # one GPU

Each mode trains in a fresh process (rl-train's hf_infer backend, one rank; the same batches:
``--batch`` sequences of ``--seq`` tokens per optimizer step) and reports:
  peak memory     CPU: the process's peak resident set (ru_maxrss; model load included, the same
                  for both modes); CUDA: torch.cuda.max_memory_allocated
  optimizer state bytes of AdamW's state tensors after the steps
  step time       median seconds of the timed steps (after one warm-up step)
  sync bytes      what one weight update sends to the engines: the full model for full
                  fine-tuning (and for an engine that needs merged weights), the adapter factors
                  for LoRA into an engine that merges them (rl_sync.adapter)
  trainable       parameters that get gradients
and the ratios LoRA / full. With LoRA the reference is the actor with its adapter disabled: the
reference worker's copy of the model (``reference bytes``) is not loaded at all.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from train import QWEN05B_SHAPE  # tools/bench/ (the script's dir)


def _bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _run_mode(spec: dict[str, Any], queue: Any) -> None:
    torch.set_num_threads(spec["threads"])
    from rl_train import build_backend
    from rl_train.testing import make_batch, nll_loss

    cuda = spec["device"] == "cuda"
    model_args: dict[str, Any] = {"dtype": spec["dtype"], "attn_implementation": "sdpa"}
    if spec["lora"]:
        model_args.update(lora_target=spec["target"], lora_rank=spec["rank"])
    backend = build_backend(
        "hf_infer",
        role="actor",
        model_path=spec["model"],
        training_args=dict(
            per_device_train_batch_size=spec["micro"],
            gradient_accumulation_steps=spec["batch"] // spec["micro"],
            learning_rate=1e-5,
        ),
        model_args=model_args,
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    vocab = int(backend.hf_config.vocab_size)  # type: ignore[attr-defined]
    times = []
    for step in range(spec["steps"] + 1):
        batch = make_batch(spec["batch"], spec["seq"], vocab=vocab, min_len=spec["seq"], seed=step)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        backend.train_step(batch, nll_loss)
        if cuda:
            torch.cuda.synchronize()
        if step:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
    optimizer = backend.optimizer  # type: ignore[attr-defined]
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    model = backend.model  # type: ignore[attr-defined]
    buckets = (
        backend.iter_adapter_buckets()  # type: ignore[attr-defined]
        if spec["lora"]
        else backend.iter_full_tensor_buckets()
    )
    peak = (
        torch.cuda.max_memory_allocated()
        if cuda
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    queue.put(
        {
            "mode": f"lora r{spec['rank']} {spec['target']}" if spec["lora"] else "full",
            "peak_memory_gib": peak / 2**30,
            "optimizer_state_mib": _bytes(state) / 2**20,
            "step_s": statistics.median(times),
            "sync_mib": _bytes(t for b in buckets for _n, t in b) / 2**20,
            "trainable_m": sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6,
            "reference_mib": 0.0 if spec["lora"] else _bytes(model.parameters()) / 2**20,
        }
    )


def run(args: argparse.Namespace, model: str) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    rows = []
    for lora in (False, True):
        spec = {**vars(args), "model": model, "lora": lora}
        queue = ctx.Queue()
        proc = ctx.Process(target=_run_mode, args=(spec, queue))
        proc.start()
        row = queue.get(timeout=args.timeout)
        proc.join(timeout=60)
        if proc.exitcode not in (0, None):
            raise RuntimeError(f"mode lora={lora} exited with {proc.exitcode}")
        rows.append(row)
    full, adapter = rows
    rows.append(
        {
            "mode": "lora / full",
            **{
                k: adapter[k] / full[k]
                for k in ("peak_memory_gib", "optimizer_state_mib", "step_s", "sync_mib")
            },
            "trainable_m": adapter["trainable_m"] / full["trainable_m"],
        }
    )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        cells = [f"{r[k]:.4g}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--layers", type=int, default=QWEN05B_SHAPE["num_layers"])
    parser.add_argument(
        "--vocab",
        type=int,
        default=QWEN05B_SHAPE["padded_vocab_size"],
        help="embedding rows (the shape's 151936 dominate a 1-layer model)",
    )
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--target", default="all-linear")
    parser.add_argument("--batch", type=int, default=4, help="sequences per optimizer step")
    parser.add_argument("--micro", type=int, default=2, help="sequences per micro-batch")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--steps", type=int, default=2, help="timed steps (after a warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--json", default="", help="also write the rows here")
    args = parser.parse_args()
    from rl_rollout.tiny_model import build_tiny_model

    shape = {**QWEN05B_SHAPE, "num_layers": args.layers, "padded_vocab_size": args.vocab}
    with tempfile.TemporaryDirectory(prefix="bench_lora_") as work:
        model = str(build_tiny_model(Path(work) / "model", **shape))
        rows = run(args, model)
    print(
        f"\n## LoRA vs full fine-tuning (Qwen2.5-0.5B shape, {args.layers} layers, vocabulary "
        f"{args.vocab}, {args.dtype}, "
        f"{args.device}, {args.batch} x {args.seq} tokens per step)\n"
    )
    print(table(rows))
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in rows))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
