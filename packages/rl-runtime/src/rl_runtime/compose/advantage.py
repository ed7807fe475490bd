"""The advantage pipeline and the KL controller from the config (estimator by name, grouping aliases)."""

from __future__ import annotations

from typing import Any

from rl_runtime.advantages import AdvantageConfig, KLControlConfig

GROUPING_ALIASES = {"state": "traj_group_id"}
"""ROLL's reward-normalisation grouping names -> ours."""


def build_advantage(cfg: Any) -> AdvantageConfig:
    rn = cfg.reward_normalization
    return AdvantageConfig(
        adv_estimator=cfg.adv_estimator,
        grouping=GROUPING_ALIASES.get(rn.grouping, rn.grouping),
        method=rn.method,
        gamma=cfg.gamma,
        lam=cfg.lambd,
        whiten_advantages=cfg.whiten_advantages,
        advantage_clip=cfg.advantage_clip,
        kl_kind=cfg.kl_penalty,
        gigpo_episode_weight=cfg.episode_reward_weight,
        gigpo_step_weight=cfg.step_reward_weight,
        gigpo_gamma=cfg.step_reward_gamma,
    )


def build_kl(cfg: Any) -> KLControlConfig:
    adaptive = (
        cfg.adaptive_kl_ctrl if cfg.adaptive_kl_ctrl is not None else cfg.target_kl is not None
    )
    if adaptive and cfg.target_kl is None:
        raise ValueError("adaptive_kl_ctrl: true needs target_kl")
    return KLControlConfig(
        in_reward=cfg.add_token_level_kl,
        init_coef=cfg.init_kl_coef,
        target=cfg.target_kl if adaptive else None,
        horizon=cfg.kl_horizon,
    )
