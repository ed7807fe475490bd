"""rl-train benchmarks.

CPU (default):  .venv/bin/python tools/bench/train.py
  1. samples/s and peak memory per backend on the tiny Qwen2 model (hf_infer 1 process; fsdp2,
     DeepSpeed ZeRO-2/3 with 2 gloo ranks), same global batch;
  2. dynamic batching and packing on a mixed-length batch (tokens/s, padding fraction), measured
     against fixed micro-batches in the same process.
CUDA:           python tools/bench/train.py --cuda [--steps 6] [--seq 2048] [--batch 16]
  random-initialised Qwen2-0.5B configuration (no download), FSDP2 on one GPU in bf16: training
  tokens/s, MFU and peak memory with/without packing and gradient checkpointing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

H200_BF16_PEAK_FLOPS = 989.4e12


def _mixed_batch(n: int, max_len: int, vocab: int, seed: int = 0):
    from rl_train.testing import make_batch

    # long-tailed lengths: most short, some near max_len (typical RL responses)
    batch = make_batch(n, max_len, vocab=vocab, min_len=8, seed=seed)
    g = torch.Generator().manual_seed(seed)
    lengths = (torch.rand(n, generator=g) ** 3 * (max_len - 8)).long() + 8
    cols = torch.arange(max_len)[None]
    attn = (cols < lengths[:, None]).long()
    batch["attention_mask"] = attn
    batch["input_ids"] = batch["input_ids"] * attn
    batch["response_mask"] = batch["response_mask"] & attn.bool()
    return batch


def _backend_worker(rank: int, spec: dict) -> None:
    torch.set_num_threads(1)
    from rl_sync.device import memory_stats, reset_peak_memory_stats
    from rl_train import build_backend
    from rl_train.testing import make_batch, nll_loss, shard_rows

    world = int(os.environ.get("WORLD_SIZE", "1"))
    backend = build_backend(
        spec["strategy"],
        role="actor",
        model_path=spec["model"],
        strategy_config=spec["cfg"],
        training_args=spec["targs"],
    )
    mini = backend.args.mini_batch_size  # type: ignore[attr-defined]
    batches = [
        shard_rows(make_batch(spec["n"], spec["len"], seed=s), rank, world, mini)
        for s in range(spec["steps"] + 1)
    ]
    backend.train_step(batches[0], nll_loss)  # warm-up
    reset_peak_memory_stats()
    t0 = time.perf_counter()
    for b in batches[1:]:
        backend.train_step(b, nll_loss)
    elapsed = time.perf_counter() - t0
    peak = memory_stats()["peak_gib"]
    Path(spec["out"], f"rank{rank}.json").write_text(json.dumps({"s": elapsed, "peak_gib": peak}))


def bench_backends(model: str, tmp: Path) -> list[dict]:
    from rl_train.dist import spawn

    zero2 = {"zero_optimization": {"stage": 2, "overlap_comm": False}}
    zero3 = {"zero_optimization": {"stage": 3}}
    n, length, steps = 16, 64, 4
    rows = []
    for name, strategy, cfg, world in [
        ("hf_infer (1 proc)", "hf_infer", {}, 1),
        ("fsdp2 (2 ranks)", "fsdp2_train", {}, 2),
        ("deepspeed zero2 (2 ranks)", "deepspeed_train", zero2, 2),
        ("deepspeed zero3 (2 ranks)", "deepspeed_train", zero3, 2),
    ]:
        out = tmp / strategy / str(cfg.get("zero_optimization", {}).get("stage", 0))
        out.mkdir(parents=True, exist_ok=True)
        spec = dict(
            strategy=strategy,
            cfg=cfg,
            model=model,
            n=n,
            len=length,
            steps=steps,
            out=str(out),
            targs=dict(
                per_device_train_batch_size=4,
                gradient_accumulation_steps=4 // world,
                learning_rate=1e-4,
            ),
        )
        if world == 1:
            _backend_worker(0, spec)
        else:
            spawn(_backend_worker, world, spec, env={"OMP_NUM_THREADS": "1"})
        res = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
        secs = max(r["s"] for r in res)
        rows.append(
            {
                "backend": name,
                "samples_per_s": n * steps / secs,
                "peak_rss_gib_per_rank": max(r["peak_gib"] for r in res),
            }
        )
        print(rows[-1], flush=True)
    return rows


def bench_batching(model: str, device_note: str = "cpu") -> list[dict]:
    from rl_train import batching, build_backend
    from rl_train.testing import nll_loss

    torch.set_num_threads(1)
    batch = _mixed_batch(32, 256, vocab=1000, seed=1)
    real = int(batch["attention_mask"].sum())
    rows = []
    for name, targs in [
        (
            "fixed micro-batches of 4 (padded)",
            dict(per_device_train_batch_size=4, gradient_accumulation_steps=8),
        ),
        (
            "dynamic, 1024-token budget (padded)",
            dict(
                per_device_train_batch_size=32,
                use_dynamic_batching=True,
                max_tokens_per_microbatch=1024,
            ),
        ),
        (
            "dynamic, 1024-token budget + packing",
            dict(
                per_device_train_batch_size=32,
                use_dynamic_batching=True,
                max_tokens_per_microbatch=1024,
                use_sequence_packing=True,
            ),
        ),
    ]:
        backend = build_backend(
            "hf_infer",
            role="actor",
            model_path=model,
            training_args=dict(learning_rate=1e-5, **targs),
        )
        args = backend.args  # type: ignore[attr-defined]
        if args.use_dynamic_batching:
            micro = batching.dynamic_micro_batches(
                batch, args.max_tokens_per_microbatch, packed=args.use_sequence_packing
            )
        else:
            micro = batching.split_micro_batches(batch, args.per_device_train_batch_size)
        micro = [batching.trim_padding(m) for m in micro]
        pad = batching.padding_fraction(micro, packed=args.use_sequence_packing)
        backend.train_step(batch, nll_loss)  # warm-up
        t0 = time.perf_counter()
        reps = 2
        for _ in range(reps):
            backend.train_step(batch, nll_loss)
        secs = (time.perf_counter() - t0) / reps
        rows.append(
            {
                "mode": name,
                "micro_batches": len(micro),
                "padding_fraction": pad,
                "real_tokens_per_s": real / secs,
            }
        )
        print(rows[-1], flush=True)
    base = rows[0]["real_tokens_per_s"]
    for r in rows:
        r["speedup_vs_fixed"] = r["real_tokens_per_s"] / base
    return rows


# -- CUDA: random-init Qwen2-0.5B ------------------------------------------------------------------
QWEN2_05B: dict[str, Any] = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
)


def _build_qwen05b(out: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_05B))
    model.save_pretrained(str(out))
    return out


def _flops_per_token(seq_len_avg: float) -> float:
    h, L, v, f = (
        QWEN2_05B[k]
        for k in ("hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size")
    )
    kv = h // QWEN2_05B["num_attention_heads"] * QWEN2_05B["num_key_value_heads"]
    per_layer = h * h * 2 + 2 * h * kv + 3 * h * f  # q, o, k, v, gate/up/down
    matmul_params = L * per_layer + v * h  # + lm_head
    attn = 2 * 2 * L * h * seq_len_avg / 2  # QK^T and PV, causal half, per token forward
    return 3 * (2 * matmul_params + attn)  # forward + backward (2x)


def _cuda_worker(rank: int, spec: dict) -> None:
    from rl_sync.device import memory_stats, reset_peak_memory_stats, synchronize
    from rl_train import build_backend
    from rl_train.testing import nll_loss

    backend = build_backend(
        "fsdp2_train",
        role="actor",
        model_path=spec["model"],
        strategy_config={"gradient_checkpointing": spec["gc"]},
        model_args={"dtype": "bf16", "attn_implementation": spec["attn"]},
        training_args=dict(
            per_device_train_batch_size=spec["micro"],
            gradient_accumulation_steps=spec["batch"] // spec["micro"],
            use_sequence_packing=spec["packed"],
            use_dynamic_batching=spec["packed"],
            max_tokens_per_microbatch=spec["budget"],
            learning_rate=1e-6,
        ),
    )
    batches = [
        _mixed_batch(spec["batch"], spec["seq"], vocab=QWEN2_05B["vocab_size"], seed=s)
        for s in range(spec["steps"] + 1)
    ]
    backend.train_step(batches[0], nll_loss)
    synchronize()
    reset_peak_memory_stats()
    t0 = time.perf_counter()
    for b in batches[1:]:
        backend.train_step(b, nll_loss)
    synchronize()
    secs = time.perf_counter() - t0
    real = sum(int(b["attention_mask"].sum()) for b in batches[1:])
    lens = torch.cat([b["attention_mask"].sum(-1) for b in batches[1:]]).float()
    avg_ctx = float((lens * lens).sum() / lens.sum())  # token-weighted sequence length
    tps = real / secs
    mfu = tps * _flops_per_token(avg_ctx) / H200_BF16_PEAK_FLOPS
    res = {
        "packing": spec["packed"],
        "grad_ckpt": spec["gc"],
        "tokens_per_s": tps,
        "mfu": mfu,
        "peak_gib": memory_stats()["peak_gib"],
    }
    Path(spec["out"]).write_text(json.dumps(res))


def bench_cuda(args: argparse.Namespace) -> list[dict]:
    from rl_train.dist import spawn

    tmp = Path(tempfile.mkdtemp(prefix="bench_train_cuda_"))
    model = str(_build_qwen05b(tmp / "qwen2-0.5b-random"))
    rows = []
    for packed in (False, True):
        for gc in (False, True):
            out = tmp / f"r_{packed}_{gc}.json"
            spec = dict(
                model=model,
                gc=gc,
                packed=packed,
                batch=args.batch,
                seq=args.seq,
                micro=args.micro,
                budget=args.budget,
                steps=args.steps,
                out=str(out),
                attn=args.attn,
            )
            try:
                spawn(_cuda_worker, 1, spec)
                rows.append(json.loads(out.read_text()))
            except Exception as err:  # OOM without checkpointing is a result too
                rows.append({"packing": packed, "grad_ckpt": gc, "error": str(err)[-300:]})
            print(rows[-1], flush=True)
    return rows


def _table(rows: list[dict]) -> str:
    keys = list(rows[0])
    for r in rows[1:]:
        keys += [k for k in r if k not in keys]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        cells = [
            f"{r.get(k):.3g}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cuda", action="store_true", help="Qwen2-0.5B random init on the GPU")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--budget", type=int, default=16384, help="token budget with packing")
    parser.add_argument("--attn", default="sdpa", help="sdpa or flash_attention_2")
    parser.add_argument("--skip-backends", action="store_true")
    args = parser.parse_args()
    if args.cuda:
        print(_table(bench_cuda(args)))
        return
    from rl_rollout.tiny_model import build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="bench_train_"))
    model = str(build_tiny_model(tmp / "tiny"))
    if not args.skip_backends:
        print("\n## Backends (tiny Qwen2, 16 samples x 64 tokens per step, CPU)\n")
        print(_table(bench_backends(model, tmp)))
    print("\n## Dynamic batching and packing (32 samples, lengths 8..256 long-tailed, CPU)\n")
    print(_table(bench_batching(model)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
