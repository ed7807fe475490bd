"""What recording learn calls costs (`record_steps`, rl_runtime.state.recorder): seconds per
actor `train_step` plain and recorded, and the record's size per step.

In-process, one rank, fp32 on the CPU: the tiny model of the CPU defaults (rl_rollout.tiny_model:
Qwen2, hidden 128, 2 layers), a batch of `--rows` rows x `--tokens` tokens, PPO-clip, one
optimizer step per call. The plain and the recorded calls alternate, so load from other processes
hits both alike. A recorded call saves the trainer's checkpoint (weights and AdamW moments) before
it, its batch and RNG state, and computes the weight checksum after it: `every:1` is the cost of
recording every step (and of `nonfinite`, which saves the checkpoint every step and keeps it
only for an anomalous one); `every:N` spreads one such cost over N steps.

    uv run python tools/bench/record_step.py [--steps 6] [--rows 16] [--tokens 64] [--threads 2]

The last line printed is `record_ratio=<float>` (median recorded / median plain seconds).

Measured (2026-11-28 22:27 and 22:33, the shared 2-core machine under load, defaults): plain
0.054 s per train_step, recorded 0.133 / 0.105 s, ratio **2.48 / 1.95**; the record 34.7 kB per step (batch, RNG, metadata),
the checkpoint before it 5.9 MB (weights and AdamW moments of the 0.43M-parameter model). The
5% target for recording every step is not met: the checkpoint write dominates, and on this tiny
model a train_step is 50 ms. `every:N` adds about 1.5/N of a train_step (N >= 30 for 5% of the
update alone); a pipeline step of the CPU defaults also rolls out, which the ratio leaves out.
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
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from rl_rollout.tiny_model import build_tiny_model
    from rl_runtime.cluster.train_worker import TrainWorker
    from rl_runtime.state.recorder import StepRecorder
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
    plain, recorded = [], []
    for step in range(1, 2 * args.steps + 3):
        batch = make_batch(args.rows, args.tokens, seed=step)
        batch["old_log_probs"] = torch.full((args.rows, args.tokens), -6.0)
        t0 = time.perf_counter()
        if step % 2:
            worker.train_step(dict(batch))
        else:
            recorder.train(OneRank(), "actor_train", [batch], "default", step=step,
                           weight_version=step, run=lambda b=batch: [worker.train_step(dict(b))])  # fmt: skip
        seconds = time.perf_counter() - t0
        if step > 2:  # the first pair warms up
            (plain if step % 2 else recorded).append(seconds)
    _, _, size, _ = recorder.written[-1]
    ckpt = sum(p.stat().st_size for p in (tmp / "records").rglob("checkpoint/**/*") if p.is_file())
    ckpt //= max(1, len(recorder.written))
    p, r = statistics.median(plain), statistics.median(recorded)
    print(f"plain_s_per_step={p:.4f} recorded_s_per_step={r:.4f}")
    print(f"record_bytes_per_step={size} checkpoint_bytes_per_step={ckpt}")
    print(f"record_ratio={r / p:.3f}")
    worker.shutdown()


if __name__ == "__main__":
    main()
