"""Env population of a step: which (group, tag, seed) each trajectory plays, and env construction.

Deterministic in `(seed, epoch)`: a resumed run replays exactly the env seeds it would have seen.
Within a group every member shares tag and seed (GRPO groups = ROLL's traj_group_id).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rl_runtime.state.seeds import env_seed, member_seed

Assignment = tuple[str, str, int]


def _partition(tags: Sequence[str], num_env_groups: int, parts: Sequence[int] | None) -> list[str]:
    if parts is None:
        base, extra = divmod(num_env_groups, len(tags))
        parts = [base + (i < extra) for i in range(len(tags))]
    if len(parts) != len(tags) or sum(parts) != num_env_groups:
        raise ValueError(
            f"num_groups_partition {list(parts)} must have one entry per tag {list(tags)} and sum "
            f"to num_env_groups={num_env_groups}"
        )
    return [tag for tag, n in zip(tags, parts) for _ in range(n)]


def env_assignments(
    *,
    tags: Sequence[str],
    num_env_groups: int,
    group_size: int,
    num_groups_partition: Sequence[int] | None,
    base_seed: int,
    epoch: int,
    split: str = "train",
    num_episodes: int | None = None,
) -> list[Assignment]:
    """Assignments `(group_id, tag, seed)` for one epoch.

    `num_env_groups` groups of `group_size` envs, tags by `num_groups_partition`. With
    `num_episodes` (ROLL's rollout_batch_size) the groups are cycled until that many episodes are
    assigned (each new round of a group gets a new seed). Validation (`split="val"`) ignores
    `epoch`, so every evaluation plays the same envs.
    """
    if not tags:
        raise ValueError(f"{split}_env_manager.tags is empty")
    if group_size < 1 or num_env_groups < 1:
        raise ValueError(f"{split}_env_manager: num_env_groups and group_size must be >= 1")
    per_group = _partition(tags, num_env_groups, num_groups_partition)
    ep = 0 if split == "val" else epoch
    total = num_episodes if num_episodes is not None else num_env_groups * group_size
    if total % group_size:
        raise ValueError(f"{total} episodes per step is not a multiple of group_size={group_size}")
    out: list[Assignment] = []
    for g in range(total // group_size):
        tag = per_group[g % num_env_groups]
        seed = env_seed(base_seed, split, ep, g)
        out.extend((f"{split}-{ep}-{g}", tag, seed) for _ in range(group_size))
    return out


class GroupSeededEnv:
    """An env whose `reset` always uses its group's seed, whatever seed the caller passes.

    The agent loop derives each request's sampling seed from the episode seed; GRPO group members
    must play the same env (same seed) yet sample differently. Each member therefore gets its own
    episode seed (for sampling) while this wrapper pins the env seed. Everything else is the
    wrapped env's.
    """

    def __init__(self, env: Any, env_seed: int) -> None:
        self._env = env
        self.env_seed = env_seed

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        return self._env.reset(seed=self.env_seed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


def make_envs(
    assignments: Sequence[Assignment],
    env_specs: Mapping[str, Mapping[str, Any]],
    *,
    render_save_dir: str | None = None,
    render_count: int | None = None,
) -> list[tuple[Any, int, str, str]]:
    """Build one episode per assignment: `(env, sampling_seed, group_id, tag)` tuples.

    `env` is a `GroupSeededEnv` (rl_envs.make_env inside) that resets with the assignment's seed;
    `sampling_seed` differs between the members of a group. `env_specs[tag]` is
    `{"env_type": ..., "config": {...}}` (a config's custom_envs entry); a tag without a spec is
    made from rl_envs' built-in tag of that name. Frames are saved to `render_save_dir` for the
    first `render_count` envs (all when None) of env types that render (a `render_save_dir`
    option: the grid games; text tasks have no frames).
    """
    from rl_envs import env_options, make_env

    envs = []
    members: dict[str, int] = {}
    for i, (group_id, tag, seed) in enumerate(assignments):
        spec = env_specs.get(tag)
        kind = str(spec.get("env_type") or tag) if spec else tag
        cfg = dict(spec.get("config", {})) if spec else {}
        if (render_save_dir and (render_count is None or i < render_count)
                and "render_save_dir" in env_options(kind)):  # fmt: skip
            cfg["render_save_dir"] = render_save_dir
        member = members.get(group_id, 0)
        members[group_id] = member + 1
        env = GroupSeededEnv(make_env(kind, **cfg), seed)
        envs.append((env, member_seed(seed, member), group_id, tag))
    return envs


def restore_env_seeds(trajectories: Sequence[Any], assignments: Sequence[Assignment]) -> list:
    """Write each assignment's env seed back into its trajectory (`Trajectory.env_seed`)."""
    import msgspec

    return [
        msgspec.structs.replace(t, env_seed=seed)
        for t, (_g, _tag, seed) in zip(trajectories, assignments)
    ]
