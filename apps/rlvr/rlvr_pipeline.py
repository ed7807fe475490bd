"""The RLVR recipe (ROLL's RLVRPipeline, verl's GRPO/DAPO trainer) on rl_runtime.pipeline's Runner.

One step: `rollout` (draw prompts from the resumable sampler -> G samples per prompt on the
actor_infer engines -> sandboxed rewards (+ DAPO overlong penalty, reward_clip) -> dynamic sampling:
drop zero-variance groups, refill up to a bound) then `learn` (collate -> old / reference
log-probs -> advantages (estimator by name) -> train -> weight sync). With `async:` the Runner runs
`rollout` ahead on its producer thread (rl_runtime.async_training). Evaluation: held-out prompts, greedy accuracy and pass@k with
val_n_sample samples. Before training: an optional supervised warm-up on the training answers.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from rlvr_options import AppOptions

from rl_config.records import SamplingParams
from rl_runtime.async_queue import RolloutBatch
from rl_runtime.collate import collate_trajectories
from rl_runtime.compose.rlvr import RlvrPlan
from rl_runtime.dynamic_sampling import fill_groups
from rl_runtime.metrics import rollout_metrics
from rl_runtime.pipeline import Context
from rl_runtime.policy_update import update_policy
from rl_runtime.rlvr_data import PromptSet, RowSampler, Scorer, tokenized_prompts
from rl_runtime.rlvr_metrics import (
    Group,
    accuracy_metrics,
    group_metrics,
    most_common_answer_accuracy,
)
from rl_runtime.rlvr_rollout import generate, group_trajectories, score_groups

STDOUT_KEYS = (
    "reward/mean",
    "reward/accuracy",
    "val/greedy/accuracy",
    "val/pass@k",
    "dynamic_sampling/dropped_groups",
    "response/length_mean",
    "train/pg_loss",
    "timing/step",
)
PROGRESS_KEYS = ("reward/accuracy", "reward/mean", "val/accuracy",
                 "dynamic_sampling/dropped_groups", "async/lag_mean")  # fmt: skip


class RlvrRecipe:
    def __init__(self, app: AppOptions, plan: RlvrPlan, model_path: str) -> None:
        self.app, self.plan, self.model_path = app, plan, model_path
        self.kl_ctl: Any = None
        self.scorer: Scorer | None = None  # owns sandbox processes: made in setup, closed in close

    # --------------------------------------------------------------------------- setup
    def setup(self, ctx: Context) -> None:
        from transformers import AutoTokenizer

        from rl_rollout.templates import get_template

        plan, c = self.plan, ctx.components
        self.tokenizer = tok = AutoTokenizer.from_pretrained(self.model_path)
        self.pad_token_id = int(
            tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        )
        self.kl_ctl = c.kl.build()

        def prompts(files: tuple[str, ...], template: str) -> PromptSet:
            return tokenized_prompts(files, plan.data, plan.rewards, tok,
                                     get_template(template, tok), plan.prompt_length)  # fmt: skip

        train, val_files = prompts(plan.data.train_files, plan.data.template), plan.data.val_files
        val = (
            prompts(val_files, plan.data.val_template).head(plan.val_prompts) if val_files else None
        )
        self.train_rows, self.train_ids = train.rows, train.ids
        self.val_rows, self.val_ids = (val.rows, val.ids) if val else ([], [])
        self.data_metrics = {"data/train_prompts": float(len(train.rows)),
                             "data/rejected_rows": float(len(train.rejected)),
                             "data/filtered_overlong_prompts": float(train.overlong)}  # fmt: skip
        for line in train.rejected[:20]:
            print(f"warning: rejected {line}", flush=True)
        if train.overlong:
            print(
                f"filtered {train.overlong} prompts longer than prompt_length={plan.prompt_length}"
            )
        self.sampler = RowSampler(self.train_rows, c.seed, plan.data.domain_interleave_probs)
        self.scorer = Scorer(plan.rewards, plan.overlong, plan.response_length,
                             allow_weak_isolation=c.sandbox_allow_weak_isolation)  # fmt: skip

    def state(self) -> dict[str, Any]:
        return {"kl_controller": self.kl_ctl.state_dict(), "sampler": self.sampler.state()}

    def rollout_state(self) -> dict[str, Any]:
        """The prompt sampler's position (asynchronous rollout draws ahead of the trainer)."""
        return {"sampler": self.sampler.state()}

    def load_rollout_state(self, state: dict[str, Any]) -> None:
        self.sampler.load_state(state["sampler"])

    def load_state(self, state: dict[str, Any]) -> None:
        if "kl_controller" in state:
            self.kl_ctl.load_state_dict(state["kl_controller"])
        if "sampler" in state:
            self.sampler.load_state(state["sampler"])

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()
            self.scorer = None

    # ------------------------------------------------------------------------ rollout
    def groups(
        self,
        ctx: Context,
        rows: list,
        ids: list,
        sampling: SamplingParams,
        generate_s: list[float] | None = None,
    ) -> list[Group]:
        """Generate and score the groups of `rows` (rl_runtime.rlvr_rollout); the seconds spent
        in the engines' generate call are appended to `generate_s` when given."""
        t0 = time.perf_counter()
        results = generate(ctx.cluster, ids, sampling)
        if generate_s is not None:
            generate_s.append(time.perf_counter() - t0)
        assert self.scorer is not None, "setup() makes the scorer"
        return score_groups(self.scorer, self.tokenizer, rows, ids, results, self.plan.reward_clip)

    # --------------------------------------------------------------------------- step
    def step(self, ctx: Context) -> dict[str, float]:
        """Synchronous step: rollout of batch `ctx.step`, then learn on it."""
        with ctx.timer.phase("rollout"):
            ctx.cluster.enter_phase("rollout")
            batch = self.rollout(ctx, ctx.step)
        return self.learn(ctx, batch)

    def rollout(self, ctx: Context, index: int) -> RolloutBatch:
        """The groups of step `index` (generated, scored, dynamic sampling) as trajectories, and
        the rollout metrics. Only actor_infer is called (asynchronous training runs this on the
        producer thread)."""
        c, plan = ctx.components, self.plan
        drawn: list[Group] = []  # every generated group, dropped ones included (metrics)
        generate_s: list[float] = []  # per generation round (the rest: decoding, scoring)

        def draw(k: int) -> list[Group]:
            rows_index = self.sampler.next(k)
            seed = c.seed * 100_003 + index * 7 + len(drawn) * 100_000_007
            sampling = msgspec.structs.replace(plan.sampling, seed=seed)
            rows = [self.train_rows[i] for i in rows_index]
            ids = [self.train_ids[i] for i in rows_index]
            fresh = self.groups(ctx, rows, ids, sampling, generate_s)
            drawn.extend(fresh)
            return fresh

        fill = fill_groups(
            draw, lambda g: g.rewards, plan.prompts_per_step,
            enable=plan.dynamic_sampling.enable,
            max_extra_rounds=plan.dynamic_sampling.max_extra_rounds,
        )  # fmt: skip
        metrics = {**fill.metrics(), **self.data_metrics, **group_metrics(drawn)}
        metrics["timing/rollout_generate"] = sum(generate_s)
        failures = self.scorer.failures if self.scorer else {}
        metrics.update({f"reward/failures/{k}": float(v) for k, v in failures.items()})
        trajectories = group_trajectories(fill.groups, index, plan.max_len_mask)
        return RolloutBatch(index, trajectories, metrics)

    def learn(self, ctx: Context, batch: RolloutBatch) -> dict[str, float]:
        """Train on `batch` (collate, then rl_runtime.policy_update) and sync the weights; an
        empty batch (every group dropped) trains on nothing."""
        timer = ctx.timer
        metrics = dict(batch.metrics)
        if not batch.trajectories:  # every group dropped within the bound: nothing to learn from
            metrics["train/skipped"] = 1.0
            metrics.update(timer.metrics())
            return metrics
        trajectories = batch.trajectories
        collated = collate_trajectories(trajectories, pad_token_id=self.pad_token_id)
        metrics.update(update_policy(ctx, collated, self.kl_ctl))
        metrics.update(rollout_metrics(trajectories, collated))
        metrics.update(timer.metrics())
        return metrics

    # --------------------------------------------------------------------- evaluation
    def evaluate(self, ctx: Context) -> dict[str, float]:
        """Held-out accuracy: greedy (val/greedy/*, with val_greedy) and sampled with
        val_n_sample samples per prompt (val/accuracy = mean over samples, val/pass@k)."""
        if not self.val_rows:
            return {}
        t0 = time.perf_counter()
        ctx.cluster.enter_phase("rollout")
        seed = ctx.components.seed * 100_003 + 1
        out: dict[str, float] = {}
        if self.plan.val_greedy:
            sampling = self.plan.val_sampling(seed, greedy=True)
            groups = self.groups(ctx, self.val_rows, self.val_ids, sampling)
            out.update(accuracy_metrics(groups, "val/greedy"))
        groups = self.groups(ctx, self.val_rows, self.val_ids, self.plan.val_sampling(seed, False))
        out.update(accuracy_metrics(groups, "val"))
        out["val/baseline_accuracy"] = most_common_answer_accuracy(self.train_rows, self.val_rows)
        out["timing/eval"] = time.perf_counter() - t0
        return out

    # ------------------------------------------------------------------------ warm-up
    def before_training(self, ctx: Context) -> dict[str, float]:
        """Supervised warm-up on the training answers (rlvr_app.warmup), then a sync."""
        from rl_runtime.rlvr_warmup import demonstrations
        from rl_runtime.sft_warmup import supervised_warmup

        w, seed = self.app.warmup, ctx.components.seed
        if w.steps <= 0:
            return {}
        demos = demonstrations(self.train_rows, self.train_ids, self.tokenizer, w, seed)
        return supervised_warmup(ctx, demos, steps=w.steps, batch_size=w.batch_size,
                                 learning_rate=w.learning_rate, log_every=10,
                                 pad_token_id=self.pad_token_id)  # fmt: skip
