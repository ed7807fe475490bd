"""resolve_ds_config sets exactly what rl_config's deepspeed warnings say it sets (they drift
apart otherwise: the config check cannot import the backend)."""

from __future__ import annotations

from typing import Any

import pytest

from rl_config import ExperimentConfig
from rl_config.rules import deepspeed_overrides, deepspeed_owned
from rl_train.args import ModelArgs, TrainingArgs
from rl_train.backends.deepspeed import plain_optimizer_step, resolve_ds_config

EXPLICIT: dict[str, Any] = {
    "bf16": {"enabled": True},
    "fp16": {"enabled": True},
    "gradient_clipping": 0.5,
    "train_batch_size": 3,
    "train_micro_batch_size_per_gpu": 5,
    "gradient_accumulation_steps": 7,
    "optimizer": {"type": "AdamW"},
    "scheduler": {"type": "WarmupLR"},
    "zero_optimization": {"stage": 2},
}


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_the_backend_sets_what_the_config_warnings_name(dtype: str) -> None:
    cfg = ExperimentConfig.model_validate({
        "pretrain": "m", "rollout_batch_size": 8, "num_return_sequences_in_group": 4,
        "max_grad_norm": 0.7, "num_gpus_per_node": 2,
        "actor_train": {
            "device_mapping": [0, 1], "model_args": {"dtype": dtype},
            "training_args": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2},
            "strategy_args": {"strategy_name": "deepspeed_train", "strategy_config": EXPLICIT},
        },
    })  # fmt: skip
    worker = cfg.actor_train
    args = TrainingArgs(per_device_train_batch_size=2, gradient_accumulation_steps=2,
                        max_grad_norm=cfg.max_grad_norm)  # fmt: skip
    resolved = resolve_ds_config(EXPLICIT, args, ModelArgs(dtype=dtype), 2, hidden_size=8)
    owned = deepspeed_owned(cfg, "actor_train", worker)
    assert {k for k, _, _ in owned} >= {"optimizer", "scheduler", "gradient_clipping"}
    for key, value, _ in owned:
        section, _, leaf = key.rpartition(".")
        node = resolved.get(section, {}) if section else resolved
        if value is None:
            assert leaf not in node, key  # dropped
        else:
            assert node[leaf] == value, key
    # every explicit value that differs is named (fp16 and bf16 cannot both agree)
    warned = {w.split(":")[0].rpartition("strategy_config.")[2] for w in deepspeed_overrides(cfg)}
    assert warned >= {"train_batch_size", "train_micro_batch_size_per_gpu", "optimizer",
                      "scheduler", "gradient_clipping", "gradient_accumulation_steps"}  # fmt: skip
    assert ("bf16.enabled" in warned) == (dtype != "bf16")
    assert ("fp16.enabled" in warned) == (dtype != "fp16")


@pytest.mark.parametrize(
    "raw,dtype,plain",
    [
        ({}, "fp32", True),
        ({"zero_optimization": {"stage": 0}}, "fp32", True),
        ({"zero_optimization": {"stage": 0}}, "bf16", False),
        ({"zero_optimization": {"stage": 1}}, "fp32", False),
        ({"zero_optimization": {"stage": 2}}, "fp32", False),
    ],
)
def test_a_plain_optimizer_step_is_clipped_by_the_backend(raw, dtype, plain) -> None:
    """ZeRO stage 0 in fp32 steps a plain optimizer: DeepSpeed's clipping (which hides the norm)
    is off there and the backend clips instead; elsewhere DeepSpeed clips at max_grad_norm."""
    args = TrainingArgs(max_grad_norm=0.7)
    resolved = resolve_ds_config(raw, args, ModelArgs(dtype=dtype), 1, hidden_size=8)
    assert plain_optimizer_step(resolved) is plain
    assert resolved["gradient_clipping"] == (0.0 if plain else 0.7)
