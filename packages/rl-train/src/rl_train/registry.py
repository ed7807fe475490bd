"""Backends by strategy name (ROLL's ``strategy_args.strategy_name``); a duplicate name is an error."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl_train.args import as_mapping, parse_model_args, parse_training_args
from rl_train.protocol import TrainBackend
from rl_train.types import LossFn

BackendFactory = Callable[..., TrainBackend]
_REGISTRY: dict[str, BackendFactory] = {}


def register_backend(name: str) -> Callable[[BackendFactory], BackendFactory]:
    def deco(factory: BackendFactory) -> BackendFactory:
        if name in _REGISTRY:
            raise ValueError(f"train backend {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return deco


def available_backends() -> list[str]:
    return sorted(_REGISTRY)


@register_backend("fsdp2_train")
def _fsdp2(**kw: Any) -> TrainBackend:
    from rl_train.backends.native import NativeBackend

    return NativeBackend(strategy_name="fsdp2_train", **kw)


@register_backend("hf_infer")
def _hf(**kw: Any) -> TrainBackend:
    from rl_train.backends.native import NativeBackend

    return NativeBackend(strategy_name="hf_infer", **kw)


@register_backend("deepspeed_train")
def _deepspeed(**kw: Any) -> TrainBackend:
    from rl_train.backends.deepspeed import DeepSpeedBackend

    return DeepSpeedBackend(**kw)


def build_backend(
    strategy_name: str,
    *,
    role: str,
    model_path: str | Path,
    strategy_config: Any = None,
    training_args: Any = None,
    model_args: Any = None,
    loss_fn: LossFn | None = None,
    loss_config: Any = None,
) -> TrainBackend:
    """Build a backend for ``role`` (actor/critic/reference) from ROLL-style worker config parts.

    ``loss_config`` (``rl_train.losses.ActorLossConfig`` for the actor, ``CriticLossConfig`` for
    the critic, ``rl_train.preference.PreferenceLossConfig`` for a preference-trained actor) builds the default loss when no ``loss_fn`` is given.
    """
    if strategy_name not in _REGISTRY:
        raise ValueError(
            f"unknown strategy_name {strategy_name!r}; registered: {available_backends()}"
        )
    if loss_fn is None and loss_config is not None and role in ("actor", "critic"):
        from rl_train.losses import build_actor_loss, build_critic_loss
        from rl_train.preference import PreferenceLossConfig, build_preference_loss

        if isinstance(loss_config, PreferenceLossConfig):
            loss_fn = build_preference_loss(loss_config)
        else:
            loss_fn = (
                build_actor_loss(loss_config) if role == "actor" else build_critic_loss(loss_config)
            )
    return _REGISTRY[strategy_name](
        role=role,
        model_path=model_path,
        strategy_config=as_mapping(strategy_config),
        args=parse_training_args(training_args),
        model_args=parse_model_args(model_args),
        loss_fn=loss_fn,
    )
