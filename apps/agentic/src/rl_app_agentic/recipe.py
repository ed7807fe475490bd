"""The agentic recipe (ROLL's AgenticPipeline) on rl_runtime.run.runner's Runner.

One step: `rollout` (AgentLoop over env groups, + greedy baseline rollouts for estimators that
need them) then `learn` (screen failed episodes, collate, then rl_runtime.step.policy_update:
log-probs, advantages, train, weight sync); model rewards score the episodes at their end
(rl_runtime.pipelines.agentic.episode_rewards). With `async:` the Runner runs `rollout` ahead on its producer thread
(rl_runtime.asynchrony.training). Evaluation: sampled and greedy validation episodes. Before training: an optional supervised
warm-up on solver demonstrations. `RolloutOnlyRecipe` dumps trajectories instead of training.
Setup, cadence, checkpoints, logging and teardown belong to the Runner; config translation to
rl_runtime.compose.
"""

from __future__ import annotations

import time
from typing import Any

from rl_app_agentic.options import AppOptions
from rl_runtime.asynchrony.queue import RolloutBatch
from rl_runtime.pipelines.agentic.gain import success_gains
from rl_runtime.pipelines.agentic.rollout import (
    assignments,
    env_configs,
    play,
    play_split,
    sandbox_stats,
)
from rl_runtime.run.context import Context, engine_weight_diff
from rl_runtime.run.recipe import Recipe
from rl_runtime.state.seeds import demo_env_seed
from rl_runtime.step.advantages import restore_kl_controller
from rl_runtime.step.collate import collate_trajectories
from rl_runtime.step.failures import screen_failures
from rl_runtime.step.metrics import rollout_metrics, val_metrics
from rl_runtime.step.policy_update import update_policy

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


class AgenticRecipe(Recipe):
    def __init__(self, app: AppOptions, model_path: str, model_rewards: tuple = ()) -> None:
        self.app = app
        self.model_path = model_path
        self.model_rewards = model_rewards  # rl_runtime.compose.model_rewards.ModelRewardPlan
        self.score_episodes: Any = None
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
        if self.model_rewards:
            from rl_runtime.pipelines.agentic.episode_rewards import EpisodeScorer

            self.score_episodes = EpisodeScorer(ctx.cluster, self.model_rewards, tok)

    def _scored(self, played: list, metrics: dict[str, float], prefix: str) -> list:
        """`played` with the model rewards' episode-end scores added (their metrics into
        `metrics`)."""
        if self.score_episodes is not None:
            metrics.update(self.score_episodes(played, prefix))
        return played

    def state(self) -> dict[str, Any]:
        return {"kl_controller": self.kl_ctl.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        if "kl_controller" in state:
            restore_kl_controller(self.kl_ctl, state["kl_controller"])

    def step(self, ctx: Context) -> dict[str, float]:
        """Synchronous step: rollout of batch `ctx.step`, then learn on it."""
        with ctx.timer.phase("rollout"):
            ctx.cluster.enter_phase("rollout")
            batch = self.rollout(ctx, ctx.step)
        return self.learn(ctx, batch)

    def rollout(self, ctx: Context, index: int) -> RolloutBatch:
        """The episodes of step `index` (a function of seed and index); with an estimator that
        needs a greedy baseline, each trajectory's `baseline_reward` is the greedy episode's
        reward on the same env. Only actor_infer is called (asynchronous training runs
        this on the producer thread)."""
        c, metrics = ctx.components, {}
        trajectories = self._scored(play_split(ctx, "train", epoch=index), metrics, "reward")
        if "baseline_scores" in c.advantage.needs:  # e.g. remax: greedy rollouts, same envs
            jobs, sampling = assignments(c, "train", index), c.sampling("train", index, True)
            greedy = self._scored(play(ctx, jobs, sampling, "train"), {}, "reward")
            for t, g in zip(trajectories, greedy, strict=True):
                t.baseline_reward = float(g.episode_reward)
        return RolloutBatch(index, trajectories, {**sandbox_stats(ctx, "train"), **metrics})

    def learn(self, ctx: Context, rollout_batch: RolloutBatch) -> dict[str, float]:
        """Train on the batch's episodes (failed ones screened out) and sync the weights."""
        c = ctx.components
        trajectories = rollout_batch.trajectories
        screened = screen_failures(trajectories, c.max_failed_fraction)  # failed: not trained on
        batch = collate_trajectories(
            screened.kept, pad_token_id=self.pad_token_id, max_length=c.sequence_length
        )
        metrics = update_policy(ctx, batch, self.kl_ctl)
        if self.app.check_sync_weights:
            metrics["sync/max_abs_diff"] = engine_weight_diff(ctx)
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
        scores: dict[str, float] = {}
        played = self._scored(play_split(ctx, "val", 0, render=self.app.render_val_envs),
                              scores, "val/reward")  # fmt: skip
        out = val_metrics(played)
        out["val/num_episodes"] = float(len(played))
        if self.app.eval_greedy:
            greedy = self._scored(
                play_split(ctx, "val", 0, greedy=True), scores, "val/greedy/reward"
            )
            out.update(val_metrics(greedy, prefix="val/greedy"))
        out.update(scores)
        out.update({f"val/{k}": v for k, v in sandbox_stats(ctx, "val").items()})
        out["timing/eval"] = time.perf_counter() - t0
        return out

    def demonstrations(self, ctx: Context) -> list:
        """The warm-up's solver-played episodes: on the training tags only (so on training maps,
        when the env splits by content), from seeds of their own ("demo" split)."""
        from rl_runtime.pipelines.agentic.demos import solver_demonstrations

        w, c = self.app.warmup, ctx.components
        assert c.train_envs is not None
        return solver_demonstrations(
            self.model_path,
            tags=list(c.train_envs.tags),
            env_configs=env_configs(c),
            num_episodes=w.episodes,
            base_seed=demo_env_seed(c.seed),
            max_tokens_per_step=c.agent.max_tokens_per_step,
            max_sequence_length=c.sequence_length,
            action_noise=w.action_noise,
            seed=c.seed,
        )

    def before_training(self, ctx: Context) -> dict[str, float]:
        """Supervised warm-up on BFS-solver demonstrations (agentic_app.warmup), then a sync."""
        from rl_runtime.step.sft_data import examples_from_trajectories
        from rl_runtime.step.sft_warmup import supervised_warmup

        w, c = self.app.warmup, ctx.components
        if w.steps <= 0 or c.train_envs is None:
            return {}
        rows = examples_from_trajectories(self.demonstrations(ctx), c.sequence_length)
        return supervised_warmup(
            ctx, rows, steps=w.steps, batch_size=w.batch_size, learning_rate=w.learning_rate,
            pad_token_id=self.pad_token_id,
        )  # fmt: skip

    def baselines(self, ctx: Context) -> dict[str, dict[str, float]]:
        """Blind policies on the validation maps (random moves, best fixed move sequence),
        scored like `evaluate`'s sampled success; FrozenLake (non-slippery) only, {} else."""
        from rl_runtime.pipelines.agentic.rollout import frozen_lake_baselines

        rows, self.distinct_val_maps = frozen_lake_baselines(ctx.components)
        return rows

    def summary(self, before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
        """The gain of RL over the warm-up on each success rate, with its standard error at n
        validation episodes, and at the distinct map count (summary.json, final lines)."""
        keys = ("val/success_rate", "val/greedy/success_rate")
        n = int(after.get("val/num_episodes", 0))
        return success_gains(before, after, keys, n, self.distinct_val_maps)
