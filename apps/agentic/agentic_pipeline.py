"""The agentic recipe (ROLL's AgenticPipeline, seed 004) on rl_runtime.pipeline's Runner.

One step: `rollout` (AgentLoop over env groups, + greedy baseline rollouts for estimators that
need them) then `learn` (screen failed episodes, collate, then rl_runtime.policy_update:
log-probs, advantages, train, weight sync). With `async:` the Runner runs `rollout` ahead on its producer thread
(rl_runtime.async_training). Evaluation: sampled and greedy validation episodes. Before training: an optional supervised
warm-up on solver demonstrations. `RolloutOnlyRecipe` dumps trajectories instead of training.
Setup, cadence, checkpoints, logging and teardown belong to the Runner; config translation to
rl_runtime.compose.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch
from agentic_options import AppOptions

from rl_runtime.async_queue import RolloutBatch
from rl_runtime.collate import collate_trajectories, shard_rows
from rl_runtime.envs import env_assignments
from rl_runtime.failures import merge_counts, screen_failures
from rl_runtime.metrics import rollout_metrics, val_metrics
from rl_runtime.pipeline import Context, engine_weight_diff
from rl_runtime.policy_update import update_policy

STDOUT_KEYS = (
    "env/success_rate",
    "env/episode_reward",
    "val/success_rate",
    "val/episode_reward",
    "train/loss",
    "train/pg_loss",
    "train/grad_norm",
    "sync/weight_version",
    "timing/step",
)


def assignments(ctx: Context, split: str, epoch: int) -> list:
    """The `(group, tag, seed)` episodes of one batch (train: rollout_batch_size; val: every val
    env once); a function of (seed, split, epoch) only."""
    c = ctx.components
    plan = c.train_envs if split == "train" else c.val_envs
    assert plan is not None
    return env_assignments(
        tags=plan.tags,
        num_env_groups=plan.num_env_groups,
        group_size=plan.group_size,
        num_groups_partition=plan.num_groups_partition,
        base_seed=c.seed,
        epoch=epoch,
        split=split,
        num_episodes=plan.num_episodes,
    )


def play_split(ctx: Context, split: str, epoch: int, greedy: bool = False, render: int = 0) -> list:
    """One batch of episodes, sampled with the configured params, or greedily."""
    sampling = ctx.components.sampling(split, epoch, greedy)
    return play(ctx, assignments(ctx, split, epoch), sampling, split, render)


def play(ctx: Context, assignments: list, sampling: Any, split: str, render: int = 0) -> list:
    render_dir = None
    if split == "val" and ctx.components.render_dir:
        render_dir = str(Path(ctx.components.render_dir) / f"step_{ctx.step:05d}")
    infer = ctx.cluster["actor_infer"]
    chunks = shard_rows(assignments, len(infer.workers))
    args = [
        (chunk, sampling, render_dir if i == 0 else None, render) for i, chunk in enumerate(chunks)
    ]
    return [t for part in infer.wait(infer.submit_each("rollout", args), "rollout") for t in part]


class AgenticRecipe:
    def __init__(self, app: AppOptions, model_path: str) -> None:
        self.app = app
        self.model_path = model_path
        self.pad_token_id = 0
        self.kl_ctl: Any = None
        self.distinct_val_maps = 0  # set by baselines()

    def setup(self, ctx: Context) -> None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.model_path)
        self.pad_token_id = int(
            tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        )
        self.kl_ctl = ctx.components.kl.build()

    def state(self) -> dict[str, Any]:
        return {"kl_controller": self.kl_ctl.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        if "kl_controller" in state:
            self.kl_ctl.load_state_dict(state["kl_controller"])

    def step(self, ctx: Context) -> dict[str, float]:
        """Synchronous step: rollout of batch `ctx.step`, then learn on it."""
        with ctx.timer.phase("rollout"):
            ctx.cluster.enter_phase("rollout")
            batch = self.rollout(ctx, ctx.step)
        return self.learn(ctx, batch)

    def rollout(self, ctx: Context, index: int) -> RolloutBatch:
        """The episodes of step `index` (a function of seed and index); with an estimator that
        needs a greedy baseline, each trajectory's `metrics["baseline_score"]` is the greedy
        episode's reward on the same env. Only actor_infer is called (asynchronous training runs
        this on the producer thread)."""
        c = ctx.components
        trajectories = play_split(ctx, "train", epoch=index)
        if "baseline_scores" in c.advantage.needs:  # e.g. remax: greedy rollouts, same envs
            jobs, sampling = assignments(ctx, "train", index), c.sampling("train", index, True)
            for t, g in zip(trajectories, play(ctx, jobs, sampling, "train"), strict=True):
                t.metrics["baseline_score"] = float(g.episode_reward)
        stats = merge_counts(ctx.cluster["actor_infer"].call_all("take_sandbox_stats"))
        return RolloutBatch(index, trajectories, stats)

    def learn(self, ctx: Context, rollout_batch: RolloutBatch) -> dict[str, float]:
        """Train on the batch's episodes (failed ones screened out) and sync the weights."""
        c = ctx.components
        trajectories = rollout_batch.trajectories
        baseline = None
        if "baseline_scores" in c.advantage.needs:
            scores = [t.metrics["baseline_score"] for t in trajectories]
            baseline = torch.tensor(scores, dtype=torch.float32)
        screened = screen_failures(trajectories, c.max_failed_fraction)  # failed: not trained on
        if baseline is not None:
            baseline = baseline[screened.kept_index]
        batch = collate_trajectories(
            screened.kept, pad_token_id=self.pad_token_id, max_length=c.sequence_length
        )
        metrics = update_policy(ctx, batch, self.kl_ctl, baseline_scores=baseline)
        if self.app.check_sync_weights:
            metrics["sync/max_abs_diff"] = engine_weight_diff(ctx.cluster)
        metrics.update(rollout_metrics(trajectories, batch))
        metrics.update(screened.metrics)
        metrics.update(rollout_batch.metrics)
        metrics.update(ctx.timer.metrics())
        return metrics

    def evaluate(self, ctx: Context) -> dict[str, float]:
        if ctx.components.val_envs is None:
            return {}
        t0 = time.perf_counter()
        ctx.cluster.enter_phase("rollout")
        played = play_split(ctx, "val", 0, render=self.app.render_val_envs)
        out = val_metrics(played)
        out["val/num_episodes"] = float(len(played))
        if self.app.eval_greedy:
            out.update(val_metrics(play_split(ctx, "val", 0, greedy=True), prefix="val/greedy"))
        out["timing/eval"] = time.perf_counter() - t0
        return out

    def demonstrations(self, ctx: Context) -> list:
        """The warm-up's solver-played episodes: on the training tags only (so on training maps,
        when the env splits by content), from seeds of their own ("demo" split)."""
        from rl_runtime.demos import solver_demonstrations

        w, c = self.app.warmup, ctx.components
        assert c.train_envs is not None
        return solver_demonstrations(
            self.model_path,
            tags=list(c.train_envs.tags),
            env_configs=env_configs(c),
            num_episodes=w.episodes,
            base_seed=c.seed + 1_000_000,
            max_tokens_per_step=c.agent.max_tokens_per_step,
            max_sequence_length=c.sequence_length,
            action_noise=w.action_noise,
            seed=c.seed,
        )

    def before_training(self, ctx: Context) -> dict[str, float]:
        """Supervised warm-up on BFS-solver demonstrations (agentic_app.warmup), then a sync."""
        w, c = self.app.warmup, ctx.components
        if w.steps <= 0 or c.train_envs is None:
            return {}
        t0 = time.perf_counter()
        demos = self.demonstrations(ctx)
        batch = collate_trajectories(
            demos, pad_token_id=self.pad_token_id, max_length=c.sequence_length
        )
        gen = torch.Generator().manual_seed(c.seed)
        actor = ctx.cluster["actor_train"]
        ctx.cluster.enter_phase("train")
        base_lr = c.role("actor_train").training_args.learning_rate
        factor = (w.learning_rate / base_lr) if w.learning_rate else 1.0
        if factor != 1.0:
            actor.call_all("scale_learning_rate", factor)
        for i in range(w.steps):
            rows = torch.randperm(batch.batch_size, generator=gen)[: w.batch_size]
            last = ctx.train("actor_train", {k: v[rows] for k, v in batch.tensors.items()}, "sft")
            if i % 5 == 0 or i == w.steps - 1:
                logged = {f"warmup/{k}": v for k, v in last.items() if isinstance(v, int | float)}
                ctx.log(logged, -(w.steps - i))
                print(
                    f"warm-up {i + 1}/{w.steps} | loss={last.get('actor/loss', float('nan')):.3f}"
                    f" | {time.perf_counter() - t0:.0f}s",
                    flush=True,
                )
        if factor != 1.0:
            actor.call_all("scale_learning_rate", 1.0 / factor)
        # fresh Adam moments for RL: the warm-up's large SFT gradients would shrink its updates
        actor.call_all("reset_optimizer_state")
        ctx.sync_weights()
        return {"warmup/seconds": time.perf_counter() - t0, "warmup/demos": float(batch.batch_size)}

    def baselines(self, ctx: Context) -> dict[str, dict[str, float]]:
        """Blind policies on the validation maps, scored like `evaluate`'s sampled success:
        uniformly random moves (exact expectation) and the best fixed move sequence (searched
        over every sequence of up to the move limit). FrozenLake (non-slippery) only; {} else."""
        c = ctx.components
        if c.val_envs is None:
            return {}
        from rl_envs.frozen_lake import FrozenLakeEnv
        from rl_envs.frozen_lake.baselines import best_fixed_sequence, random_policy_success
        from rl_runtime.envs import make_envs

        states, limits, maps = [], set(), set()
        for env, *_ in make_envs(assignments(ctx, "val", 0), env_configs(c)):
            if not isinstance(env._env, FrozenLakeEnv) or env.is_slippery:
                return {}
            env.reset()
            states.append(env.state)
            limits.add(env.max_steps)
            maps.add(env.content_key())
        if len(limits) != 1:
            return {}
        self.distinct_val_maps = len(maps)
        turns = limits.pop()
        sequence, fixed = best_fixed_sequence(states, turns)
        return {
            "random policy": {"val/success_rate": random_policy_success(states, turns)},
            f"best fixed sequence ({' '.join(sequence)})": {"val/success_rate": fixed},
        }

    def summary(self, before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
        """The gain of RL over the warm-up on each success rate, with the standard error of a
        difference of two proportions at n validation episodes (summary.json, final lines)."""
        n = int(after.get("val/num_episodes", 0))
        out: dict[str, Any] = {
            f"gain {key}": proportion_gain(before[key], after[key], n)
            for key in ("val/success_rate", "val/greedy/success_rate")
            if key in before and key in after and n
        }
        if out and self.distinct_val_maps:
            # maps drawn twice are not independent: the standard error at the distinct count
            # is the cautious one
            out["validation maps"] = {"episodes": n, "distinct": self.distinct_val_maps}
            for key in ("val/success_rate", "val/greedy/success_rate"):
                if f"gain {key}" in out:
                    at = proportion_gain(before[key], after[key], self.distinct_val_maps)
                    out[f"gain {key}"]["gain_in_se_at_distinct"] = at["gain_in_se"]
        return out


def env_configs(c: Any) -> dict[str, dict[str, Any]]:
    """`{tag: {"env_type", "config"}}` of the composed env specs (what make_envs takes)."""
    return {tag: {"env_type": s.env_type, "config": s.config} for tag, s in c.env_specs.items()}


def proportion_gain(before: float, after: float, n: int) -> dict[str, float]:
    """`after - before` of two success rates over n episodes each, its standard error
    sqrt(p1 (1 - p1) / n + p2 (1 - p2) / n) and the gain in standard errors."""
    se = math.sqrt((before * (1 - before) + after * (1 - after)) / n)
    gain = after - before
    return {
        "gain": round(gain, 4),
        "se": round(se, 4),
        "gain_in_se": round(gain / se, 2) if se > 0 else float("inf"),
        "n": n,
    }


class RolloutOnlyRecipe:
    """Each step plays one training batch with the initial policy and appends it to JSONL."""

    def __init__(self, out_dir: str) -> None:
        self.path = Path(out_dir) / "rollouts.jsonl"
        self.total = 0

    def step(self, ctx: Context) -> dict[str, float]:
        from rl_config.records import to_jsonl

        trajectories = play_split(ctx, "train", epoch=ctx.step)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab" if ctx.step else "wb") as f:
            f.write(to_jsonl(trajectories))
        self.total += len(trajectories)
        succ = sum(t.success for t in trajectories) / max(1, len(trajectories))
        return {"env/success_rate": succ, "env/num_trajectories": float(len(trajectories))}

    def evaluate(self, ctx: Context) -> dict[str, float]:
        return {}


def summary_row(metrics: dict[str, float]) -> dict[str, float | str]:
    keys = ("success_rate", "greedy/success_rate", "episode_reward", "num_turns", "format_ok")
    return {k: float(metrics[f"val/{k}"]) for k in keys if f"val/{k}" in metrics}
