"""What recording every learn call costs (`record_steps=every:1`, rl_runtime.state.recorder):
seconds per actor `train_step` plain and recorded, in one run, and the record's size per step.

In-process, one rank, fp32 on the CPU: the tiny model of the CPU defaults (rl_rollout.tiny_model:
Qwen2, hidden 128, 2 layers), a batch of `--rows` rows x `--tokens` tokens, PPO-clip, one
optimizer step per call. Blocks of `--block` plain calls and `--block` recorded calls alternate
(so load from other processes hits both alike); the recorder numbers its calls consecutively, as
`every:1` does, so its records chain to a checkpoint saved every 50 of them
(`CHAIN_CHECKPOINT_EVERY`), and each recorded block ends by waiting for the background writer:
its work (batch files, metadata, signing, fsync) is charged to the recorded block. On the
learn call's path stay the batch copy, the RNG state, the weight checksum after the step and,
every 50th record, the checkpoint before it.

    uv run python tools/bench/record_step.py [--rounds 5] [--block 10] [--rows 16] [--tokens 64]

The last line printed is `record_ratio=<float>` (recorded / plain seconds, totals over the run).
Measured numbers: the rl-runtime README ("Record and replay a training step").
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from rl_rollout.tiny_model import build_tiny_model
    from rl_runtime.cluster.train_worker import TrainWorker
    from rl_runtime.state.recorder import StepRecorder
    from rl_runtime.state.step_record import CHECKPOINT_DIR
    from rl_train.args import TrainingArgs
    from rl_train.losses import ActorLossConfig
    from rl_train.testing import make_batch

    tmp = Path(tempfile.mkdtemp(prefix="record-bench-"))
    model = build_tiny_model(tmp / "tiny", seed=0)
    worker = TrainWorker(
        rank=0, world_size=1, dist_env={"OMP_NUM_THREADS": str(args.threads)}, role="actor",
        model_path=str(model), strategy_name="fsdp2_train",
        training_args=TrainingArgs(per_device_train_batch_size=args.rows,
                                   gradient_accumulation_steps=1, learning_rate=1e-5),
        loss_config=ActorLossConfig(),
    )  # fmt: skip

    class OneRank:
        def call_all(self, method: str, *a: object, **k: object) -> list:
            return [getattr(worker, method)(*a, **k)]

    recorder = StepRecorder("every", 1, tmp / "records", config_hash="bench", key_file=None)
    batches = []
    for i in range(4):
        batch = make_batch(args.rows, args.tokens, seed=i)
        batch["old_log_probs"] = torch.full((args.rows, args.tokens), -6.0)
        batches.append(batch)
    for batch in batches[:2]:  # warm-up
        worker.train_step(dict(batch))
    plain = recorded = 0.0
    per_call: dict[str, list[float]] = {"plain": [], "recorded": []}
    step = 0
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for i in range(args.block):
            t = time.perf_counter()
            worker.train_step(dict(batches[i % 4]))
            per_call["plain"].append(time.perf_counter() - t)
        plain += time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(args.block):
            step += 1
            b = batches[i % 4]
            t = time.perf_counter()
            recorder.train(OneRank(), "actor_train", [b], "default", step=step,
                           weight_version=step, run=lambda b=b: [worker.train_step(dict(b))])  # fmt: skip
            per_call["recorded"].append(time.perf_counter() - t)
        recorder.flush()
        recorded += time.perf_counter() - t0
    recorder.close()
    worker.shutdown()
    rows = recorder.written
    sizes = [size for _s, _r, size, _ in rows]
    on_path = [secs for *_, secs in rows]
    root = tmp / "records"
    ckpts = [p for p in root.glob(f"step-*/actor_train/{CHECKPOINT_DIR}")]
    ckpt_bytes = sum(f.stat().st_size for c in ckpts for f in c.rglob("*") if f.is_file())
    n = args.rounds * args.block
    print(f"steps={n} plain_s_per_step={plain / n:.4f} recorded_s_per_step={recorded / n:.4f}")
    print(
        f"median_call_s plain={statistics.median(per_call['plain']):.4f} "
        f"recorded={statistics.median(per_call['recorded']):.4f} "
        f"recorder_on_path_s_per_step={sum(on_path) / len(on_path):.4f}"
    )
    print(
        f"record_bytes_per_step={statistics.mean(sizes):.0f} checkpoints={len(ckpts)} "
        f"checkpoint_bytes_each={ckpt_bytes // max(1, len(ckpts))}"
    )
    print(f"record_ratio={recorded / plain:.3f}")


if __name__ == "__main__":
    main()
