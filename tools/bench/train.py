"""rl-train benchmarks.

CPU (default):  .venv/bin/python tools/bench/train.py
  1. samples/s and peak memory per backend on the tiny Qwen2 model (hf_infer 1 process; fsdp2,
     DeepSpeed ZeRO-2/3 with 2 gloo ranks), same global batch;
  2. dynamic batching and packing on a mixed-length batch (tokens/s, padding fraction), measured
     against fixed micro-batches in the same process.
CUDA:           python tools/bench/train.py --device cuda [--steps 4] [--only 0,3] [--profile 3]
  a randomly initialised model of Qwen2.5-0.5B's shape (no download), bf16, one GPU, 16 sequences
  of 2048-4096 tokens per step: tokens/s, MFU (formula in ``flops_per_token``) and peak memory for
  a hand-written HF + AdamW loop (the baseline, same process's batches), FSDP2 (padded, packed with
  sdpa, packed with the varlen kernel, + activation checkpointing) and DeepSpeed ZeRO-2/3.
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


# -- CUDA: random-init Qwen2.5-0.5B shape ------------------------------------------------------------
QWEN05B_SHAPE: dict[str, Any] = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_layers=24,
    num_heads=14,
    num_kv_heads=2,
    padded_vocab_size=151936,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    initializer_range=0.02,
)
# Dense bf16 tensor-core peak (no sparsity) by device name; MFU is reported against it.
PEAK_BF16_FLOPS = {"H100": 989.4e12, "H200": 989.4e12, "H20": 148e12, "A100": 312e12}


def build_qwen05b_shaped(out: Path) -> Path:
    """Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14/2 heads, MLP 4864, 151,936 embedding rows,
    tied), random init, with the local tiny tokenizer; nothing is downloaded."""
    from rl_rollout.tiny_model import build_tiny_model

    return build_tiny_model(out, **QWEN05B_SHAPE)


def flops_per_token(ctx_avg: float) -> float:
    """Training FLOPs per token, forward + backward = 3x forward:
    forward = 2 * (matmul parameters: q, k, v, o, gate, up, down per layer + the lm_head)
            + 2 * 2 * layers * hidden * ctx_avg / 2  (QK^T and PV, causal: half the context),
    with ctx_avg the token-weighted sequence length. Embedding look-ups and norms are not counted;
    activation checkpointing's recompute is not counted (MFU, not HFU)."""
    h, layers, f = (
        QWEN05B_SHAPE["hidden_size"],
        QWEN05B_SHAPE["num_layers"],
        QWEN05B_SHAPE["intermediate_size"],
    )
    v = QWEN05B_SHAPE["padded_vocab_size"]
    kv = h // QWEN05B_SHAPE["num_heads"] * QWEN05B_SHAPE["num_kv_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * f
    matmul_params = layers * per_layer + v * h
    attention = 2 * 2 * layers * h * ctx_avg / 2
    return 3 * (2 * matmul_params + attention)


def _peak_flops(override: float | None) -> tuple[float, str]:
    if override:
        return override * 1e12, "given"
    name = torch.cuda.get_device_name(0)
    for key, value in PEAK_BF16_FLOPS.items():
        if key in name:
            return value, name
    raise SystemExit(f"unknown peak bf16 FLOP/s for {name!r}: pass --peak-tflops")


def _long_batch(n: int, lo: int, hi: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """``n`` right-padded rows with lengths uniform in ``[lo, hi]``; prompt = first 256 tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g)
    cols = torch.arange(hi)[None]
    attn = (cols < lengths[:, None]).long()
    ids = torch.randint(3, vocab, (n, hi), generator=g) * attn
    return {"input_ids": ids, "attention_mask": attn, "response_mask": attn.bool() & (cols >= 256)}


def _baseline_worker(rank: int, spec: dict) -> None:
    """The loop a user writes by hand: HF model (fp32 weights, bf16 autocast, sdpa), fused AdamW,
    padded micro-batches, ``labels=`` cross-entropy. Same batches as the backends."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        spec["model"], dtype=torch.float32, attn_implementation="sdpa"
    ).cuda()
    if spec["gc"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    batches = [
        _long_batch(spec["batch"], spec["min_len"], spec["seq"], 151936, s)
        for s in range(spec["steps"] + 1)
    ]

    def step(batch: dict[str, torch.Tensor]) -> None:
        for i in range(0, spec["batch"], spec["micro"]):
            mb = {k: v[i : i + spec["micro"]].cuda() for k, v in batch.items()}
            t = int(mb["attention_mask"].sum(-1).max())
            labels = mb["input_ids"][:, :t].masked_fill(~mb["response_mask"][:, :t], -100)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(
                    input_ids=mb["input_ids"][:, :t],
                    attention_mask=mb["attention_mask"][:, :t],
                    labels=labels,
                ).loss
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    _time_steps(step, batches, spec)


def _time_steps(step, batches, spec) -> None:
    from rl_sync.device import memory_stats, reset_peak_memory_stats, synchronize

    step(batches[0])  # warm-up
    synchronize()
    reset_peak_memory_stats()
    t0 = time.perf_counter()
    for b in batches[1:]:
        step(b)
    synchronize()
    secs = time.perf_counter() - t0
    lens = torch.cat([b["attention_mask"].sum(-1) for b in batches[1:]]).float()
    result = {
        "seconds": secs,
        "tokens": float(lens.sum()),
        "ctx_avg": float((lens * lens).sum() / lens.sum()),
        "peak_gib": memory_stats()["peak_gib"],
    }
    if spec.get("profile"):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step(batches[1])
            synchronize()
        result["profile"] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    Path(spec["out"]).write_text(json.dumps(result))


def _cuda_worker(rank: int, spec: dict) -> None:
    from rl_train import build_backend
    from rl_train.testing import nll_loss

    backend = build_backend(
        spec["strategy"],
        role="actor",
        model_path=spec["model"],
        strategy_config={**spec["cfg"], "gradient_checkpointing": spec["gc"]},
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
        _long_batch(spec["batch"], spec["min_len"], spec["seq"], 151936, s)
        for s in range(spec["steps"] + 1)
    ]
    _time_steps(lambda b: backend.train_step(b, nll_loss), batches, spec)


_ZERO2, _ZERO3 = {"zero_optimization": {"stage": 2}}, {"zero_optimization": {"stage": 3}}
_LOGITS = {"fused_lm_head": False}  # log-probs over materialised [N, V] logits (the old path)
_COMPILE = {"compile_layers": True}
CUDA_CONFIGS: list[dict[str, Any]] = [
    dict(name=name, strategy=strategy, cfg=cfg, attn=attn, packed=packed, gc=gc, budget=budget)
    for name, strategy, cfg, attn, packed, gc, budget in (
        ("baseline: HF + AdamW loop, padded, sdpa", "baseline", {}, "sdpa", False, False, None),
        ("fsdp2, packed, varlen, logits", "fsdp2_train", _LOGITS, "varlen", True, False, None),
        ("fsdp2, packed, varlen, fused head", "fsdp2_train", {}, "varlen", True, False, None),
        ("fsdp2, packed 32k, fused head", "fsdp2_train", {}, "varlen", True, False, 32768),
        (
            "fsdp2, packed 32k, fused, compiled",
            "fsdp2_train",
            _COMPILE,
            "varlen",
            True,
            False,
            32768,
        ),
        (
            "fsdp2, packed 48k, fused, compiled",
            "fsdp2_train",
            _COMPILE,
            "varlen",
            True,
            False,
            49152,
        ),
        (
            "fsdp2, packed 64k, fused, compiled, ckpt",
            "fsdp2_train",
            _COMPILE,
            "varlen",
            True,
            True,
            65536,
        ),
        (
            "zero2, packed, varlen, logits",
            "deepspeed_train",
            {**_ZERO2, **_LOGITS},
            "varlen",
            True,
            False,
            None,
        ),
        (
            "zero2, packed 48k, fused, compiled",
            "deepspeed_train",
            {**_ZERO2, **_COMPILE},
            "varlen",
            True,
            False,
            49152,
        ),
        (
            "zero3, packed 48k, fused, compiled",
            "deepspeed_train",
            {**_ZERO3, **_COMPILE},
            "varlen",
            True,
            False,
            49152,
        ),
    )
]


def bench_cuda(args: argparse.Namespace) -> list[dict]:
    """Every chosen CUDA config's row; the ~1 GB model and the results live in a temp dir that
    is removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="bench_train_cuda_") as work:
        return _bench_cuda_configs(args, Path(work))


def _bench_cuda_configs(args: argparse.Namespace, tmp: Path) -> list[dict]:
    from rl_train.dist import spawn

    peak, device_name = _peak_flops(args.peak_tflops)
    model = str(build_qwen05b_shaped(tmp / "qwen2.5-0.5b-shape"))
    only = set(args.only.split(",")) if args.only else None
    rows = []
    for i, conf in enumerate(CUDA_CONFIGS):
        if only is not None and str(i) not in only:
            continue
        out = tmp / f"r{i}.json"
        spec = dict(
            conf,
            model=model,
            batch=args.batch,
            seq=args.seq,
            min_len=args.min_len,
            micro=args.micro,
            budget=conf["budget"] or args.budget,
            steps=args.steps,
            out=str(out),
            profile=args.profile == i,
        )
        row: dict[str, Any] = {"config": conf["name"]}
        print(f"[{time.strftime('%H:%M:%S')}] {i}: {conf['name']}", flush=True)
        try:
            spawn(_baseline_worker if conf["strategy"] == "baseline" else _cuda_worker, 1, spec)
            res = json.loads(out.read_text())
            tps = res["tokens"] / res["seconds"]
            row.update(
                tokens_per_s=tps,
                mfu=tps * flops_per_token(res["ctx_avg"]) / peak,
                peak_gib=res["peak_gib"],
            )
            if "profile" in res:
                print(res["profile"])
        except Exception as err:  # an OOM is a result too
            row["error"] = str(err)[-300:]
        rows.append(row)
        print(row, flush=True)
    base = (
        rows[0].get("tokens_per_s") if rows and rows[0]["config"].startswith("baseline") else None
    )
    for r in rows:
        if base and "tokens_per_s" in r:
            r["x_baseline"] = r["tokens_per_s"] / base
    print(
        f"\n{device_name}; peak {peak / 1e12:.0f} TFLOP/s bf16 dense; {args.batch} sequences of "
        f"{args.min_len}-{args.seq} tokens per step; token budget {args.budget} when packed"
    )
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
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--cuda", action="store_true", help="same as --device cuda")
    parser.add_argument("--steps", type=int, default=4, help="timed steps (after one warm-up)")
    parser.add_argument("--seq", type=int, default=4096, help="longest sequence (cuda)")
    parser.add_argument("--min-len", type=int, default=2048, help="shortest sequence (cuda)")
    parser.add_argument("--batch", type=int, default=16, help="sequences per step (cuda)")
    parser.add_argument("--micro", type=int, default=4, help="rows per padded micro-batch")
    parser.add_argument("--budget", type=int, default=16384, help="token budget with packing")
    parser.add_argument("--only", default="", help="comma-separated config indices (cuda)")
    parser.add_argument("--profile", type=int, default=-1, help="profile one step of config N")
    parser.add_argument("--peak-tflops", type=float, default=None, help="override the peak")
    parser.add_argument("--skip-backends", action="store_true")
    parser.add_argument("--build-model", default="", help="only build the 0.5B-shaped model here")
    args = parser.parse_args()
    if args.build_model:
        print(build_qwen05b_shaped(Path(args.build_model)))
        return
    if args.cuda or args.device == "cuda":
        print(_table(bench_cuda(args)))
        return
    from rl_rollout.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="bench_train_") as work:
        tmp = Path(work)
        model = str(build_tiny_model(tmp / "tiny"))
        if not args.skip_backends:
            print("\n## Backends (tiny Qwen2, 16 samples x 64 tokens per step, CPU)\n")
            print(_table(bench_backends(model, tmp)))
        print("\n## Dynamic batching and packing (32 samples, lengths 8..256 long-tailed, CPU)\n")
        print(_table(bench_batching(model)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
