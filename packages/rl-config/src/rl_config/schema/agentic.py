"""Agentic sections: env managers (``train_env_manager``/``val_env_manager``) and ``custom_envs``."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rl_config.schema.base import StrictModel

TEMPLATE_FIELDS = frozenset({"turn_idx", "observation", "actions_left", "max_response_length"})
"""Placeholders an agent template may use."""


class CustomEnv(StrictModel):
    """One env definition, referenced by its key (its *tag*) from the env managers."""

    env_type: str = Field(
        default=...,
        description="Registered env type (rl_envs registry), e.g. sokoban, frozen_lake.",
    )
    max_steps: int = Field(
        default=10, ge=1, description="Actions per trajectory at most (env steps / turns)."
    )
    max_tokens_per_step: int = Field(
        default=128, ge=1, description="Tokens the model may generate per turn at most."
    )
    env_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Constructor options of the env type (validated by the env itself; see "
        "docs/rl-envs.md), e.g. frozen_lake's size, p, is_slippery, random_start, random_goal, "
        "min_path_length, and every text game's layout_split (train|val: play only maps whose "
        "content hash falls in that split) and val_fraction (share of maps that are val).",
    )
    agent_system_template: str | None = Field(
        default=None,
        description="System prompt of the agent (the env's system_prompt option); unset: the "
        "env's own system prompt.",
    )
    agent_template: str | None = Field(
        default=None,
        description="Per-turn user message (the env's turn_template option); placeholders "
        "{turn_idx}, {observation}, {actions_left}, {max_response_length}; unset: the env's own.",
    )
    max_env_step_concurrent: int | None = Field(
        default=None, ge=1, description="Concurrent env.step calls at most for this env type."
    )
    env_manager_cls: str | None = Field(
        default=None,
        description="ROLL env-manager class path; accepted for compatibility, ignored.",
    )
    use_thread_lock: bool = Field(
        default=False, description="ROLL option; accepted for compatibility, ignored."
    )


class EnvManagerConfig(StrictModel):
    """A population of env groups that rolls out trajectories (ROLL EnvManagerConfig)."""

    num_env_groups: int = Field(
        default=1,
        ge=1,
        description="Env groups. Each group runs group_size envs with the same config and seed.",
    )
    group_size: int = Field(
        default=1,
        ge=1,
        description="Trajectories per group (G): envs in a group share config and seed, so their "
        "rewards are comparable (GRPO groups).",
    )
    group_size_redundancy: int = Field(
        default=0, ge=0, description="Extra envs per group started to absorb failures/slow envs."
    )
    tags: list[str] = Field(
        default_factory=lambda: ["SimpleSokoban"],
        description="Env tags (keys of custom_envs) this manager runs.",
    )
    num_groups_partition: list[int] | None = Field(
        default=None,
        description="Groups per tag, same order as tags; must sum to num_env_groups. Unset: "
        "num_env_groups split equally over tags.",
    )
    max_env_num_per_worker: int = Field(
        default=0,
        ge=0,
        description="Envs per env worker process at most; 0 = all envs in one worker.",
    )
    max_traj_per_env: int = Field(
        default=-1,
        ge=-1,
        description="Trajectories one env may produce per step; -1 = as many as needed.",
    )
    format_penalty: float = Field(
        default=0.0,
        le=0,
        description="Reward added (a penalty, <= 0) when a response does not follow the action "
        "format.",
    )
    worker_cls: str | None = Field(
        default=None, description="ROLL env worker class path; accepted for compatibility, ignored."
    )

    @property
    def final_group_size(self) -> int:
        """Envs started per group: group_size + group_size_redundancy."""
        return self.group_size + self.group_size_redundancy

    @property
    def num_envs(self) -> int:
        """Envs in total: num_env_groups × final_group_size."""
        return self.num_env_groups * self.final_group_size

    def groups_per_tag(self) -> dict[str, int]:
        """Groups of each tag (num_groups_partition, or an equal split)."""
        if self.num_groups_partition is not None:
            return dict(zip(self.tags, self.num_groups_partition))
        base, extra = divmod(self.num_env_groups, max(1, len(self.tags)))
        return {tag: base + (1 if i < extra else 0) for i, tag in enumerate(self.tags)}
