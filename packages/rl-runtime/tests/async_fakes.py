"""Trajectories and rollout batches for the asynchronous-training tests."""

from __future__ import annotations

from rl_config.records import Trajectory
from rl_runtime.asynchrony.queue import (
    RolloutBatch,
)


def traj(group: str, version: int, token_versions: list[int] | None = None, k: int = 0):
    return Trajectory(
        traj_id=f"{group}-{k}", group_id=group, tag="t", env_seed=0, token_ids=[1, 2, 3],
        prompt_length=1, response_mask=[False, True, True], rollout_log_probs=[0.0, -1.0, -1.0],
        weight_version=version, token_versions=token_versions or [],
    )  # fmt: skip


def batch(index: int, n: int) -> RolloutBatch:
    return RolloutBatch(index, [traj(f"g{index}", index, k=k) for k in range(n)])
