"""The advantage pipeline and the KL controller from the config (estimator by name, grouping aliases)."""

from __future__ import annotations

import inspect
from typing import Any

from rl_runtime.step.advantages import AdvantageConfig, KLControlConfig, estimator_needs

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
        reward_clip=cfg.reward_clip,
        kl_kind=cfg.kl_penalty,
        gigpo_episode_weight=cfg.episode_reward_weight,
        gigpo_step_weight=cfg.step_reward_weight,
        gigpo_gamma=cfg.step_reward_gamma,
    )


def estimator_keys_read(estimator: str) -> dict[str, bool]:
    """Which of the estimator-specific config keys `estimator` reads (rl_runtime.step.advantages
    passes each by its signature): `lambd` and `gamma` (GAE with a critic; `gamma` also by
    token-discounting estimators), and GiGPO's `step_reward_gamma`, `episode_reward_weight`,
    `step_reward_weight` (step-wise estimators)."""
    from rl_algos.advantages import get_estimator

    params = inspect.signature(get_estimator(estimator)).parameters
    needs = estimator_needs(estimator)
    step_wise = "step_rows" in needs
    return {
        "lambd": "values" in needs,
        "gamma": ("gamma" in params and not step_wise) or "token_gamma" in params,
        "step_reward_gamma": "gamma" in params and step_wise,
        "episode_reward_weight": "episode_weight" in params,
        "step_reward_weight": "step_weight" in params,
    }


def unread_estimator_keys(cfg: Any) -> list[str]:
    """A warning for each estimator-specific key set away from its default that
    `cfg.adv_estimator` never reads (e.g. `lambd` with grpo: no critic, no GAE)."""
    fields = type(cfg).model_fields
    return [
        f"{key}={getattr(cfg, key)!r} has no effect with adv_estimator={cfg.adv_estimator} "
        f"(it does not read {key})"
        for key, read in estimator_keys_read(cfg.adv_estimator).items()
        if not read and getattr(cfg, key) != fields[key].default
    ]


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
