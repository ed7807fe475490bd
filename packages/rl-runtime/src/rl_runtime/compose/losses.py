"""Policy and value loss configs from ROLL's algorithm keys (pg_clip aliases, dual clip, IS correction)."""

from __future__ import annotations

import math
from typing import Any

from rl_train.losses import ActorLossConfig, CriticLossConfig, ISFilterConfig, ISWeightConfig


def build_actor_loss(cfg: Any) -> ActorLossConfig:
    """ROLL's algorithm keys -> ActorLossConfig (pg_clip, or pg_clip_low/high when
    use_pg_clip_range; dual_clip_c when dual_clip_loss; train_infer_correction)."""
    worker = cfg.actor_train
    name = worker.pg_variant or "ppo_clip"
    if cfg.use_pg_clip_range:
        low, high = cfg.pg_clip_low, cfg.pg_clip_high
    else:
        low = high = cfg.pg_clip
    weight, filters = build_is_correction(cfg.train_infer_correction)
    return ActorLossConfig(
        policy_loss=name,
        loss_agg_mode=cfg.loss_agg_mode,
        clip_ratio_low=float(low if low is not None else 0.2),
        clip_ratio_high=float(high if high is not None else 0.2),
        dual_clip_c=cfg.dual_clip_c if cfg.dual_clip_loss else None,
        rl_loss_coef=cfg.rl_loss_coef,
        use_kl_loss=cfg.use_kl_loss,
        kl_loss_coef=cfg.kl_loss_coef,
        kl_loss_type=cfg.kl_loss_type,
        entropy_loss_coef=cfg.entropy_loss_coef,
        is_weight=weight,
        is_filters=filters,
    )


def build_is_correction(tic: Any) -> tuple[ISWeightConfig | None, tuple[ISFilterConfig, ...]]:
    """train_infer_correction -> truncated IS weights and ratio filters."""

    def level(value: str, key: str) -> str:
        if value == "segment":
            raise ValueError(f"train_infer_correction.{key}: segment is not supported")
        return value

    iw = tic.is_weight
    weight = None
    if iw.enabled:
        bound = math.inf if iw.upper_bound is None else float(iw.upper_bound)
        weight = ISWeightConfig(
            level=level(iw.weight_type, "is_weight.weight_type"), upper_bound=bound
        )  # type: ignore[arg-type]
    filters = []
    for i, f in enumerate(tic.filters):
        if not f.enabled:
            continue
        if f.diff_enabled or not f.ratio_enabled:
            raise ValueError(
                f"train_infer_correction.filters[{i}]: only ratio filters are supported "
                "(diff_enabled: false, ratio_enabled: true)"
            )
        lvl = level(f.agg_type, f"filters[{i}].agg_type")
        filters.append(ISFilterConfig(level=lvl, low=f.ratio_low, high=f.ratio_high))  # type: ignore[arg-type]
    return weight, tuple(filters)


def build_critic_loss(cfg: Any) -> CriticLossConfig:
    return CriticLossConfig(value_clip=cfg.value_clip, loss_agg_mode=cfg.loss_agg_mode)
