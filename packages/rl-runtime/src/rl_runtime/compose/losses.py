"""Policy and value loss configs from ROLL's algorithm keys (pg_clip aliases, dual clip, IS correction)."""

from __future__ import annotations

import math
from typing import Any

from rl_config.errors import ConfigError, ConfigIssue
from rl_train.losses import (
    CLIP_RANGE_OPTION,
    DUAL_CLIP_OPTION,
    ActorLossConfig,
    CriticLossConfig,
    ISFilterConfig,
    ISWeightConfig,
    clip_kwargs,
)


def response_budget(cfg: Any) -> int:
    """Response tokens at most: `response_length`, else `actor_infer.generating_args.max_new_tokens`."""
    return cfg.response_length or cfg.actor_infer.generating_args.max_new_tokens


def loss_norm_constant(cfg: Any, pipeline: str | None, max_new_tokens: int) -> float:
    """Dr.GRPO's constant normaliser of `seq-mean-token-sum-norm` (MAX_TOKENS, arXiv:2503.20783):
    the most tokens one sample can be trained on, fixed by the config so that a response's
    gradient does not depend on its prompt's length or on the rest of the batch.

    RLVR (and any non-agentic pipeline): the response budget, `response_length` (else
    `max_new_tokens`), exactly what the engine may generate. Agentic: the trajectory's generation
    budget, `max_new_tokens` per turn (`max_tokens_per_step` capped by `max_new_tokens`) times
    the most turns of a training env (`custom_envs.<tag>.max_steps` over train_env_manager.tags),
    capped by `sequence_length`. `sequence_length` alone is a fixed bound too, but it also counts
    the prompt and the env's observation tokens, which are never trained on; the generation
    budget is the bound of the trained (response_mask) tokens, as MAX_TOKENS is in Dr.GRPO."""
    if pipeline != "agentic":
        return float(response_budget(cfg))
    manager, envs = cfg.train_env_manager, cfg.custom_envs
    turns = [envs[tag].max_steps for tag in (manager.tags if manager else ()) if tag in envs]
    if not turns:
        return float(cfg.sequence_length)
    return float(min(cfg.sequence_length, max_new_tokens * max(turns)))


def build_actor_loss(
    cfg: Any, norm_constant: float | None = None, warnings: list[str] | None = None
) -> ActorLossConfig:
    """ROLL's algorithm keys -> ActorLossConfig (pg_clip, or pg_clip_low/high when
    use_pg_clip_range; dual_clip_c when dual_clip_loss; train_infer_correction).

    Clip keys reach every pg_variant whose signature reads them (rl_train.losses.clip_kwargs).
    Unwritten (pg_clip absent or None, use_pg_clip_range false), the variant keeps its own
    published default (gspo 3e-4/4e-4, not PPO's 0.2). A written clip key the variant cannot
    read is a ConfigError naming it; pg_clip written at its default value, a warning
    (appended to `warnings`) and dropped."""
    worker = cfg.actor_train
    name = worker.pg_variant or "ppo_clip"
    if cfg.use_pg_clip_range:
        low, high = cfg.pg_clip_low, cfg.pg_clip_high
        range_keys, at_default = "use_pg_clip_range", False
    else:
        low = high = cfg.pg_clip
        range_keys = "pg_clip"
        plain = getattr(cfg, "__wrapped__", cfg)
        at_default = low == type(plain).model_fields["pg_clip"].default
        if at_default and "pg_clip" not in plain.model_fields_set:
            low = high = None  # not written: the variant's own default
    dual_c = cfg.dual_clip_c if cfg.dual_clip_loss else None
    unread = clip_kwargs(name, low, high, dual_c)[1]
    if CLIP_RANGE_OPTION in unread and at_default:  # pg_clip written at its default: dropped
        why = unread.pop(CLIP_RANGE_OPTION)
        if warnings is not None:
            warnings.append(f"pg_clip={low!r} has no effect with pg_variant={name} ({why})")
        low = high = None
    issues = [
        ConfigIssue(key, f"cannot be used with actor_train.pg_variant={name}: {why}")
        for key, why in (
            (range_keys, unread.get(CLIP_RANGE_OPTION)),
            ("dual_clip_loss", unread.get(DUAL_CLIP_OPTION)),
        )
        if why is not None
    ]
    if issues:
        raise ConfigError(issues)
    weight, filters = build_is_correction(cfg.train_infer_correction)
    return ActorLossConfig(
        policy_loss=name,
        loss_agg_mode=cfg.loss_agg_mode,
        clip_ratio_low=None if low is None else float(low),
        clip_ratio_high=None if high is None else float(high),
        dual_clip_c=dual_c,
        norm_constant=norm_constant,
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


def build_critic_loss(cfg: Any, norm_constant: float | None = None) -> CriticLossConfig:
    """value_clip, loss_agg_mode and the `seq-mean-token-sum-norm` constant (loss_norm_constant)."""
    return CriticLossConfig(
        value_clip=cfg.value_clip, loss_agg_mode=cfg.loss_agg_mode, norm_constant=norm_constant
    )
