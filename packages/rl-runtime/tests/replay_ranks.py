"""A role of 2 gloo ranks recording its learn calls from inside its processes (spawned by
rl_train.dist.spawn: module level, importable by the children): each rank runs the real
`StepRecorder`, whose group calls run on the rank and gather every rank's result."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from rl_runtime.cluster.train_worker import TrainWorker
from rl_runtime.state.recorder import StepRecorder
from rl_runtime.step.collate import shard_rows
from rl_train.args import TrainingArgs
from rl_train.losses import ActorLossConfig
from rl_train.testing import make_batch


class RankGroup:
    """`call_all` on this rank's worker, every rank's result gathered in rank order."""

    def __init__(self, worker: TrainWorker) -> None:
        self.worker = worker

    def gather(self, value: Any) -> list[Any]:
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, value)
        return out

    def call_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return self.gather(getattr(self.worker, method)(*args, **kwargs))


def full_batch(step: int) -> dict[str, torch.Tensor]:
    batch = make_batch(8, 12, vocab=1000, seed=step)
    g = torch.Generator().manual_seed(step)
    batch["old_log_probs"] = -4.0 - torch.rand(8, 12, generator=g)
    return batch


def record_two_steps(rank: int, model: str, root: str, strategy: str) -> None:
    """Pipeline steps 1 and 2 of an actor on this rank's half of each batch; step 2 recorded."""
    worker = TrainWorker(
        rank=rank, world_size=2, dist_env={}, role="actor", model_path=model,
        strategy_name=strategy,
        training_args=TrainingArgs(per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                   learning_rate=1e-2),
        loss_config=ActorLossConfig(),
    )  # fmt: skip
    group = RankGroup(worker)
    recorder = StepRecorder("every", 2, root, config_hash="c", key_file=None, writes=rank == 0)
    for step in (1, 2):
        shards = shard_rows(full_batch(step), 2)
        recorder.train(group, "actor_train", shards, "default", step=step, weight_version=step,
                       run=lambda s=shards: group.gather(worker.train_step(dict(s[rank]))))  # fmt: skip
    recorder.close()
    dist.barrier()
