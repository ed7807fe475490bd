"""Episodes of the agentic pipeline on the actor_infer engines: which envs a batch plays (a
function of seed, split and epoch), playing them over every engine, the blind baselines of the
validation envs, and the rollout-only recipe that dumps trajectories instead of training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_runtime.run.recipe import Recipe
from rl_runtime.step.collate import shard_rows
from rl_runtime.step.envs import Assignment, env_assignments, make_envs


def env_configs(components: Any) -> dict[str, dict[str, Any]]:
    """`{tag: {"env_type", "config"}}` of the composed env specs (what make_envs takes)."""
    return {
        tag: {"env_type": s.env_type, "config": s.config} for tag, s in components.env_specs.items()
    }


def assignments(components: Any, split: str, epoch: int) -> list[Assignment]:
    """The `(group, tag, seed)` episodes of one batch (train: rollout_batch_size; val: every val
    env once); a function of (seed, split, epoch) only."""
    plan = components.train_envs if split == "train" else components.val_envs
    assert plan is not None, f"no {split} envs composed"
    return env_assignments(
        tags=plan.tags,
        num_env_groups=plan.num_env_groups,
        group_size=plan.group_size,
        num_groups_partition=plan.num_groups_partition,
        base_seed=components.seed,
        epoch=epoch,
        split=split,
        num_episodes=plan.num_episodes,
    )


def play(ctx: Any, jobs: list[Assignment], sampling: Any, split: str, render: int = 0) -> list:
    """The trajectories of `jobs`, sharded over every actor_infer engine (their sandbox counts
    kept under `split`: `sandbox_stats`); validation renders the first `render` episodes of the
    first engine under render_dir/step_<step>."""
    render_dir = None
    if split == "val" and ctx.components.render_dir:
        render_dir = str(Path(ctx.components.render_dir) / f"step_{ctx.step:05d}")
    infer = ctx.cluster["actor_infer"]
    chunks = shard_rows(jobs, len(infer.workers))
    args = [
        (chunk, sampling, render_dir if i == 0 else None, render, split)
        for i, chunk in enumerate(chunks)
    ]
    return [t for part in infer.wait(infer.submit_each("rollout", args), "rollout") for t in part]


def sandbox_stats(ctx: Any, split: str) -> dict[str, float]:
    """The `sandbox/*` counts of every actor_infer engine's `split` rollouts since the last take
    of `split` (training's are never an evaluation's)."""
    from rl_runtime.step.failures import merge_counts

    return merge_counts(ctx.cluster["actor_infer"].call_all("take_sandbox_stats", split))


def play_split(ctx: Any, split: str, epoch: int, greedy: bool = False, render: int = 0) -> list:
    """One batch of `split` episodes, sampled with the configured params, or greedily."""
    sampling = ctx.components.sampling(split, epoch, greedy)
    return play(ctx, assignments(ctx.components, split, epoch), sampling, split, render)


def frozen_lake_baselines(components: Any) -> tuple[dict[str, dict[str, float]], int]:
    """Blind policies on the validation envs, scored like sampled validation success: uniformly
    random moves (exact expectation) and the best fixed move sequence (searched over every
    sequence up to the move limit); and the number of distinct validation maps. Non-slippery
    FrozenLake with one move limit only: `({}, 0)` otherwise."""
    if components.val_envs is None:
        return {}, 0
    from rl_envs.frozen_lake import FrozenLakeEnv
    from rl_envs.frozen_lake.baselines import best_fixed_sequence, random_policy_success

    states, limits, maps = [], set(), set()
    for env, *_ in make_envs(assignments(components, "val", 0), env_configs(components)):
        if not isinstance(env._env, FrozenLakeEnv) or env.is_slippery:
            return {}, 0
        env.reset()
        states.append(env.state)
        limits.add(env.max_steps)
        maps.add(env.content_key())
    if len(limits) != 1:
        return {}, 0
    turns = limits.pop()
    sequence, fixed = best_fixed_sequence(states, turns)
    rows = {
        "random policy": {"val/success_rate": random_policy_success(states, turns)},
        f"best fixed sequence ({' '.join(sequence)})": {"val/success_rate": fixed},
    }
    return rows, len(maps)


class RolloutOnlyRecipe(Recipe):
    """Each step plays one training batch with the initial policy and appends it to
    `<out_dir>/rollouts.jsonl`."""

    def __init__(self, out_dir: str) -> None:
        self.path = Path(out_dir) / "rollouts.jsonl"
        self.total = 0

    def step(self, ctx: Any) -> dict[str, float]:
        from rl_config.records import to_jsonl

        trajectories = play_split(ctx, "train", epoch=ctx.step)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab" if ctx.step else "wb") as f:
            f.write(to_jsonl(trajectories))
        self.total += len(trajectories)
        succ = sum(t.success for t in trajectories) / max(1, len(trajectories))
        return {"env/success_rate": succ, "env/num_trajectories": float(len(trajectories))}

    def evaluate(self, ctx: Any) -> dict[str, float]:
        return {}
