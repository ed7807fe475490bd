"""Env managers (which envs a split plays) and env specs by tag."""

from __future__ import annotations

from typing import Any

from rl_runtime.compose.components import EnvManagerPlan, EnvSpec


def build_env_manager(mgr: Any, num_episodes: int | None) -> EnvManagerPlan | None:
    if mgr is None:
        return None
    part = mgr.num_groups_partition
    return EnvManagerPlan(
        tags=tuple(mgr.tags),
        num_env_groups=mgr.num_env_groups,
        group_size=mgr.group_size,
        num_groups_partition=tuple(part) if part is not None else None,
        num_episodes=num_episodes,
    )


def build_env_specs(custom_envs: Any) -> dict[str, EnvSpec]:
    """custom_envs -> EnvSpec per tag; `max_steps` (turns per episode) goes into the env's
    options, and must agree with an `env_config.max_steps` given there too."""
    out = {}
    for tag, env in custom_envs.items():
        config = dict(env.env_config or {})
        inner = config.setdefault("max_steps", env.max_steps)
        if inner != env.max_steps:
            raise ValueError(
                f"custom_envs.{tag}.max_steps={env.max_steps} disagrees with "
                f"custom_envs.{tag}.env_config.max_steps={inner}; set one of them"
            )
        out[tag] = EnvSpec(env_type=env.env_type, config=config)
    return out
