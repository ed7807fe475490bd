"""A small agentic config and its composition, for the rl_runtime.compose tests."""

from __future__ import annotations

import copy
from typing import Any

from rl_config.schema import ExperimentConfig
from rl_runtime.compose import compose

BASE: dict[str, Any] = {
    "pretrain": "tiny",
    "rollout_batch_size": 4,
    "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["FL"]},
    "val_env_manager": {"num_env_groups": 2, "group_size": 1, "tags": ["FL"]},
    "custom_envs": {"FL": {"env_type": "frozen_lake", "max_steps": 4}},
    "actor_train": {"training_args": {"per_device_train_batch_size": 2}},
}


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _components(extra: dict | None = None, **kwargs):
    return compose(ExperimentConfig.model_validate(_merge(BASE, extra or {})), **kwargs)
