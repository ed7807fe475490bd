"""The RLVR recipe (ROLL's RLVRPipeline, verl's GRPO/DAPO trainer) on rl_runtime.run.runner's Runner.

One step: `rollout` (draw prompts from the resumable sampler -> G samples per prompt on the
actor_infer engines -> sandboxed rewards (+ DAPO overlong penalty) -> dynamic sampling:
drop zero-variance groups, refill up to a bound) then `learn` (collate -> old / reference
log-probs -> advantages (reward normalisation, reward_clip, estimator by name) -> train -> weight
sync). With `async:` the Runner
runs `rollout` ahead on its producer thread (rl_runtime.asynchrony.training). Evaluation: held-out
prompts, greedy accuracy and pass@k with val_n_sample samples. Before training: an optional
supervised warm-up on the training answers. The parts: rl_runtime.pipelines.rlvr.data (prompts, sampler,
scorer), rlvr_rollout (generation, dynamic sampling), rlvr_eval (held-out accuracy).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rl_app_rlvr.options import AppOptions
from rl_runtime.asynchrony.queue import PendingBatch, RolloutBatch, finished
from rl_runtime.pipelines.rlvr.compose import RlvrPlan
from rl_runtime.pipelines.rlvr.data import RlvrPrompts, load_rlvr_prompts
from rl_runtime.pipelines.rlvr.eval import held_out_accuracy
from rl_runtime.pipelines.rlvr.metrics import add_batch_failures, held_out_gains
from rl_runtime.pipelines.rlvr.rollout import GroupGenerator, rollout_batch
from rl_runtime.pipelines.rlvr.scoring import Scorer
from rl_runtime.run.context import Context
from rl_runtime.run.recipe import Recipe
from rl_runtime.step.advantages import restore_kl_controller
from rl_runtime.step.model_rewards import model_scorers
from rl_runtime.step.policy_update import learn_on_groups

STDOUT_KEYS = ("reward/mean", "reward/accuracy", "val/greedy/accuracy", "val/pass@k",
               "dynamic_sampling/dropped_groups", "response/length_mean", "train/pg_loss",
               "timing/step")  # fmt: skip
PROGRESS_KEYS = ("reward/accuracy", "reward/mean", "val/accuracy",
                 "dynamic_sampling/dropped_groups", "async/lag_mean")  # fmt: skip


class RlvrRecipe(Recipe):
    def __init__(self, app: AppOptions, plan: RlvrPlan, model_path: str) -> None:
        self.app, self.plan, self.model_path = app, plan, model_path
        self.kl_ctl: Any = None
        self.scorer: Scorer | None = None  # owns sandbox processes: made in setup, closed in close
        #: the run's failed reward calls by kind, the trainer's state: of the training rollouts
        #: (added up as `learn` takes each batch) and of the evaluations
        self.reward_failures: Counter[str] = Counter()
        self.eval_reward_failures: Counter[str] = Counter()
        #: groups dynamic sampling generated and kept over the run's trained batches
        self.groups: Counter[str] = Counter()

    # --------------------------------------------------------------------------- setup
    def setup(self, ctx: Context) -> None:
        from transformers import AutoTokenizer

        plan, c = self.plan, ctx.components
        self.tokenizer = tok = AutoTokenizer.from_pretrained(self.model_path)
        self.pad_token_id = int(
            tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        )
        self.kl_ctl = c.kl.build()
        self.prompts: RlvrPrompts = load_rlvr_prompts(plan, tok, c.seed)
        self.scorer = Scorer(plan.rewards, plan.overlong, plan.response_length,
                             allow_weak_isolation=c.sandbox_allow_weak_isolation,
                             model_scorers=model_scorers(ctx.cluster, plan.model_rewards))  # fmt: skip
        self.generator = GroupGenerator(self.scorer, tok)

    def state(self) -> dict[str, Any]:
        return {"kl_controller": self.kl_ctl.state_dict(),
                "reward_failures": dict(self.reward_failures),
                "eval_reward_failures": dict(self.eval_reward_failures),
                "groups": dict(self.groups), **self.rollout_state()}  # fmt: skip

    def rollout_state(self) -> dict[str, Any]:
        """The rollout side's state: the prompt sampler's position (asynchronous rollout draws
        ahead of the trainer)."""
        return {"sampler": self.prompts.sampler.state()}

    def load_rollout_state(self, state: dict[str, Any]) -> None:
        self.prompts.sampler.load_state(state["sampler"])

    def load_state(self, state: dict[str, Any]) -> None:
        if "kl_controller" in state:
            restore_kl_controller(self.kl_ctl, state["kl_controller"])
        # a checkpoint from before the totals were saved: from 0
        self.reward_failures = Counter(state.get("reward_failures") or {})
        self.eval_reward_failures = Counter(state.get("eval_reward_failures") or {})
        self.groups = Counter(state.get("groups") or {})
        if "sampler" in state:
            self.load_rollout_state(state)

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()
            self.scorer = None

    # --------------------------------------------------------------------------- step
    def step(self, ctx: Context) -> dict[str, float]:
        """Synchronous step: rollout of batch `ctx.step`, then learn on it."""
        with ctx.timer.phase("rollout"):
            ctx.cluster.enter_phase("rollout")
            batch = finished(self.rollout(ctx, ctx.step))
        return self.learn(ctx, batch)

    def rollout(self, ctx: Context, index: int) -> RolloutBatch | PendingBatch:
        """Step `index`'s scored groups after dynamic sampling, as trajectories, and the rollout
        metrics (rl_runtime.pipelines.rlvr.rollout.rollout_batch; asynchronous training runs this on the
        producer thread, which scores a batch while the next one generates)."""
        return rollout_batch(ctx.cluster, self.generator, self.prompts, self.plan,
                             seed=ctx.components.seed, index=index,
                             defer_scoring=True)  # fmt: skip

    def learn(self, ctx: Context, batch: RolloutBatch) -> dict[str, float]:
        """Train on `batch` and sync the weights (rl_runtime.step.policy_update.learn_on_groups);
        its failed reward calls join the run's totals (`reward/failures/<kind>`)."""
        metrics = learn_on_groups(ctx, batch, self.kl_ctl, pad_token_id=self.pad_token_id)
        metrics.update(add_batch_failures(batch.metrics, self.reward_failures))
        for kind in ("generated", "kept"):
            self.groups[kind] += int(batch.metrics.get(f"dynamic_sampling/{kind}_groups", 0))
        return metrics

    # --------------------------------------------------------------------- evaluation
    def evaluate(self, ctx: Context) -> dict[str, float]:
        """Held-out accuracy: greedy (val/greedy/*, with val_greedy) and sampled with
        val_n_sample samples per prompt (val/accuracy = mean over samples, val/pass@k), and the
        evaluations' reward-failure totals (val/reward_failures/*)."""
        seed = ctx.components.seed
        return held_out_accuracy(ctx.cluster, self.generator, self.prompts, self.plan, seed,
                                 failures=self.eval_reward_failures)  # fmt: skip

    def summary(self, before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
        """RL's held-out gains with their standard errors (rl_runtime.pipelines.rlvr.metrics.
        held_out_gains) and the share of generated groups dynamic sampling kept (summary.json,
        final lines)."""
        out = held_out_gains(before, after)
        if self.groups["generated"]:
            out["dynamic_sampling kept fraction"] = round(
                self.groups["kept"] / self.groups["generated"], 4
            )
        return out

    # ------------------------------------------------------------------------ warm-up
    def before_training(self, ctx: Context) -> dict[str, float]:
        """Supervised warm-up on the training answers (rl_runtime.pipelines.rlvr.warmup.warm_up)."""
        from rl_runtime.pipelines.rlvr.warmup import warm_up

        return warm_up(ctx, self.prompts.train, self.tokenizer, self.app.warmup, self.pad_token_id)
