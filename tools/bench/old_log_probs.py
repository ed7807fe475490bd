"""The trainer's implicit old-policy forward (rl_train.core.train_step with the policy loss and no
`old_log_probs` in the batch), one pass over several mini-batches: the whole batch forwarded
before the first optimizer step (rl-train up to 2026-11-24) against only the mini-batches after
the first (the first takes its training forward's detached log-probs). One `train_step` each, in
the same process, taking turns (the order alternates each repeat) so load from other processes
hits both alike. fp32 on the CPU, `torch.set_num_threads(--threads)`.

Shape: apps/rlvr's CPU default step: its tiny Qwen2 (tools/bench/shared_prompt.py's `rlvr_tiny`),
32 prompts of 34 tokens x 8 samples = 256 rows, responses of 6-10 tokens, micro-batches of 32,
`--minis` mini-batches per step (2 in the app: per_device_train_batch_size 32 x
gradient_accumulation_steps 4), infer_batch_size 64, share_prompt_forward on.

    uv run python tools/bench/old_log_probs.py [--minis 2] [--repeats 10] [--threads 1]

Prints the median seconds per train_step of each path and their ratio (whole / after_first).

Measured on a quiet 2-core machine, 2026-11-24 00:37-00:39, 1 thread: 2 mini-batches (the
app's): whole 0.365 / after_first 0.327 s (ratio 1.12; per-repeat median 1.14; 10 repeats) and
0.448 / 0.351 s (1.28; 1.22; 12 repeats); 4 mini-batches: 0.433 / 0.395 s (1.10; 1.08). The
saving is the forward over one mini-batch, so it shrinks as 1/minis.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from shared_prompt import Shape, build_model_dir, make_batch  # tools/bench/ (the script's dir)

RLVR_STEP = Shape(8, 32, (34, 34), (6, 10), False, "rlvr_tiny")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--minis", type=int, default=2, help="optimizer steps per train_step")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    from rl_train import build_backend
    from rl_train.losses import ActorLossConfig, build_actor_loss

    rows = RLVR_STEP.prompts * RLVR_STEP.rows_per_prompt
    if rows % (32 * args.minis):
        raise SystemExit(
            f"--minis {args.minis}: {rows} rows do not split into 32-row micro-batches"
        )
    with tempfile.TemporaryDirectory() as tmp:
        backend = build_backend(
            "hf_infer",
            role="actor",
            model_path=build_model_dir(RLVR_STEP.model, Path(tmp)),
            training_args=dict(
                per_device_train_batch_size=32,
                gradient_accumulation_steps=rows // (32 * args.minis),
                infer_batch_size=64,
                share_prompt_forward=True,
                learning_rate=1e-6,
                lr_scheduler_type="constant",
            ),
        )
        vocab = int(backend.model.config.vocab_size)  # type: ignore[attr-defined]
        batch = make_batch(RLVR_STEP, vocab, seed=0)
        batch["advantages"] = torch.randn(batch["input_ids"].shape) * batch["response_mask"]
        loss_fn = build_actor_loss(ActorLossConfig(policy_loss="ppo_clip"))

        def whole() -> None:  # the former behaviour: the old-policy forward over every row
            old = backend.forward(batch).log_probs
            backend.train_step({**batch, "old_log_probs": old}, loss_fn)

        def after_first() -> None:
            backend.train_step(dict(batch), loss_fn)

        paths = {"whole": whole, "after_first": after_first}
        times: dict[str, list[float]] = {name: [] for name in paths}
        for fn in paths.values():  # warm-up
            fn()
        for i in range(args.repeats):
            for name in list(paths) if i % 2 == 0 else list(paths)[::-1]:
                t0 = time.perf_counter()
                paths[name]()
                times[name].append(time.perf_counter() - t0)
    medians = {name: statistics.median(t) for name, t in times.items()}
    ratios = [a / b for a, b in zip(times["whole"], times["after_first"], strict=True)]
    print(
        f"{rows} rows, {args.minis} mini-batches, {args.threads} thread(s), {args.repeats} repeats: "
        f"whole {medians['whole']:.3f} s, after_first {medians['after_first']:.3f} s per train_step"
    )
    print(
        f"ratio whole/after_first {medians['whole'] / medians['after_first']:.3f} "
        f"(median of per-repeat ratios {statistics.median(ratios):.3f})"
    )


if __name__ == "__main__":
    main()
