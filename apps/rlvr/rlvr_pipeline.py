"""The RLVR recipe (ROLL's RLVRPipeline, verl's GRPO/DAPO trainer) on rl_runtime.pipeline's Runner.

One step: `rollout` (draw prompts from the resumable sampler -> G samples per prompt on the
actor_infer engines -> sandboxed rewards (+ DAPO overlong penalty, reward_clip) -> dynamic sampling:
drop zero-variance groups, refill up to a bound) then `learn` (collate -> old / reference
log-probs -> advantages (estimator by name) -> train -> weight sync). With `async:` the Runner runs
`rollout` ahead on its producer thread (rl_runtime.async_training). Evaluation: held-out prompts, greedy accuracy and pass@k with
val_n_sample samples. Before training: an optional supervised warm-up on the training answers.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import replace
from statistics import mean
from typing import Any

import msgspec
import torch
from rlvr_options import AppOptions

from rl_algos.rewards import clip_rewards
from rl_config.records import GenerationRequest, GenerationResult, SamplingParams, Trajectory, Turn
from rl_runtime.async_queue import RolloutBatch
from rl_runtime.collate import collate_trajectories, shard_rows
from rl_runtime.compose.rlvr import RlvrPlan
from rl_runtime.dynamic_sampling import fill_groups
from rl_runtime.metrics import rollout_metrics
from rl_runtime.pipeline import Context
from rl_runtime.policy_update import update_policy
from rl_runtime.rlvr_data import RowSampler, Scorer, load_prompts
from rl_runtime.rlvr_metrics import Group, accuracy_metrics, group_metrics

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


class RlvrRecipe:
    def __init__(self, app: AppOptions, plan: RlvrPlan, model_path: str) -> None:
        self.app, self.plan, self.model_path = app, plan, model_path
        self.kl_ctl: Any = None
        self.scorer: Scorer | None = None  # owns sandbox processes: made in setup, closed in close
        self.failures: Counter[str] = Counter()
        # asynchronous training scores rollout batches (producer thread) while evaluating
        self.scoring = threading.Lock()

    # --------------------------------------------------------------------------- setup
    def setup(self, ctx: Context) -> None:
        from transformers import AutoTokenizer

        from rl_rollout.templates import get_template

        plan, c = self.plan, ctx.components
        self.tokenizer = tok = AutoTokenizer.from_pretrained(self.model_path)
        self.pad_token_id = int(
            tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        )
        template = get_template(plan.data.template, tok)
        self.kl_ctl = c.kl.build()
        self.train_rows, self.train_ids, rejected, overlong = self._prompts(
            plan.data.train_files, template
        )
        val_files, val_template = plan.data.val_files, get_template(plan.data.val_template, tok)
        self.val_rows, self.val_ids, _, _ = (
            self._prompts(val_files, val_template) if val_files else ([], [], [], 0)
        )
        self.val_rows, self.val_ids = (
            self.val_rows[: plan.val_prompts],
            self.val_ids[: plan.val_prompts],
        )
        self.data_metrics = {"data/train_prompts": float(len(self.train_rows)),
                             "data/rejected_rows": float(len(rejected)),
                             "data/filtered_overlong_prompts": float(overlong)}  # fmt: skip
        for line in rejected[:20]:
            print(f"warning: rejected {line}", flush=True)
        if overlong:
            print(f"filtered {overlong} prompts longer than prompt_length={plan.prompt_length}")
        self.sampler = RowSampler(self.train_rows, c.seed, plan.data.domain_interleave_probs)
        self.scorer = Scorer(plan.rewards, plan.overlong, plan.response_length,
                             allow_weak_isolation=c.sandbox_allow_weak_isolation)  # fmt: skip

    def _prompts(
        self, files: tuple[str, ...], template: Any
    ) -> tuple[list, list[list[int]], list[str], int]:
        """Rows, their prompt token ids (`template`), rejected-row lines, and how many prompts
        were longer than prompt_length (dropped, as verl's filter_overlong_prompts)."""
        rows, rejected = load_prompts(files, self.plan.data, self.plan.rewards)
        kept, ids = [], []
        for row in rows:
            tokens = self.tokenizer(template.prefix(row.prompt), add_special_tokens=False)
            if len(tokens["input_ids"]) <= self.plan.prompt_length:
                kept.append(replace(row, index=len(kept)))  # index: position in the kept rows
                ids.append(list(tokens["input_ids"]))
        if not kept:
            raise ValueError(f"{list(files)}: every prompt is longer than prompt_length")
        return kept, ids, rejected, len(rows) - len(kept)

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
    def generate(self, ctx: Context, prompts: list[list[int]], sampling: SamplingParams) -> list:
        """`sampling.n` results per prompt, `[len(prompts)][n]`, over every engine."""
        requests = [
            GenerationRequest(
                request_id=str(i),
                prompt_ids=p,
                sampling=msgspec.structs.replace(sampling, seed=(sampling.seed or 0) * 1009 + i),
            )
            for i, p in enumerate(prompts)
        ]
        infer = ctx.cluster["actor_infer"]
        chunks = shard_rows(requests, len(infer.workers))
        parts = infer.wait(infer.submit_each("generate", [(c,) for c in chunks]), "generate")
        out: list[list[GenerationResult]] = [[] for _ in prompts]
        for result in (r for part in parts for r in part):
            out[int(result.request_id)].append(result)
        return out

    def groups(
        self,
        ctx: Context,
        rows: list,
        ids: list,
        sampling: SamplingParams,
        generate_s: list[float] | None = None,
    ) -> list[Group]:
        """Generate and score the groups of `rows` (rewards after reward_clip); every sample of
        the batch is scored in one call to the sandboxed reward manager. The seconds spent in
        the engines' generate call are appended to `generate_s` when given."""
        t0 = time.perf_counter()
        results = self.generate(ctx, ids, sampling)
        if generate_s is not None:
            generate_s.append(time.perf_counter() - t0)
        texts = [[self.tokenizer.decode(r.output_ids, skip_special_tokens=True) for r in res]
                 for res in results]  # fmt: skip
        assert self.scorer is not None, "setup() makes the scorer"
        with self.scoring:
            flat = self.scorer.score(
                [row for row, res in zip(rows, results) for _ in res],
                [t for ts in texts for t in ts],
                [len(r.output_ids) for res in results for r in res],
            )
            self.failures.update(s.kind for s in flat if not s.ok)
        groups, start = [], 0
        for row, prompt, res, ts in zip(rows, ids, results, texts, strict=True):
            scores, start = flat[start : start + len(res)], start + len(res)
            raw = torch.tensor([s.reward for s in scores])
            rewards = clip_rewards(raw, self.plan.reward_clip).tolist()
            groups.append(Group(row, prompt, res, ts, scores, rewards))
        return groups

    def trajectories(self, groups: list[Group], step: int) -> list[Trajectory]:
        """One single-turn Trajectory per sample; with max_len_mask a truncated response is
        kept for its group's statistics but not trained on (response_mask False)."""
        out = []
        for g_index, g in enumerate(groups):
            p = len(g.prompt_ids)
            for k, (res, reward, score) in enumerate(zip(g.results, g.rewards, g.scores)):
                o = len(res.output_ids)
                truncated = res.finish_reason == "length"
                train = not (truncated and self.plan.max_len_mask)
                success = score.ok and score.reward >= 1.0
                out.append(Trajectory(
                    traj_id=f"{step}-{g_index}-{k}", group_id=f"{step}-{g_index}",
                    tag=g.row.data_source, env_seed=g.row.index,
                    token_ids=[*g.prompt_ids, *res.output_ids], prompt_length=p,
                    response_mask=[False] * p + [train] * o,
                    rollout_log_probs=[0.0] * p + list(res.output_log_probs),
                    turns=[Turn(turn_idx=0, start=p, end=p + o, reward=reward,
                                truncated=truncated, info={"reward_ok": score.ok})],
                    episode_reward=reward, success=success,
                    termination_reason="max_length" if truncated else ("success" if success else "terminated"),
                    weight_version=res.weight_version, failed=False,
                    # per-token versions when a generation continued under newer weights
                    token_versions=[res.weight_version] * p + list(res.token_versions)
                    if res.token_versions else [],
                ))  # fmt: skip
        return out

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
        metrics.update({f"reward/failures/{k}": float(v) for k, v in self.failures.items()})
        return RolloutBatch(index, self.trajectories(fill.groups, index), metrics)

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
        out["val/baseline_accuracy"] = self.baseline_accuracy()
        out["timing/eval"] = time.perf_counter() - t0
        return out

    def baseline_accuracy(self) -> float:
        """Accuracy on the held-out prompts of always answering the most frequent training
        answer (a trivial baseline)."""
        common = Counter(str(r.ground_truth) for r in self.train_rows).most_common(1)[0][0]
        return mean(float(str(r.ground_truth) == common) for r in self.val_rows)

    # ------------------------------------------------------------------------ warm-up
    def before_training(self, ctx: Context) -> dict[str, float]:
        """Supervised warm-up on the training answers (rlvr_app.warmup), then a sync."""
        from rl_runtime.rlvr_warmup import demonstrations

        w = self.app.warmup
        if w.steps <= 0:
            return {}
        t0 = time.perf_counter()
        demos = demonstrations(
            self.train_rows, self.train_ids, self.tokenizer, w, ctx.components.seed
        )
        batch = collate_trajectories(demos, pad_token_id=self.pad_token_id)
        gen = torch.Generator().manual_seed(ctx.components.seed)
        actor = ctx.cluster["actor_train"]
        ctx.cluster.enter_phase("train")
        base_lr = ctx.components.role("actor_train").training_args.learning_rate
        factor = (w.learning_rate / base_lr) if w.learning_rate else 1.0
        if factor != 1.0:
            actor.call_all("scale_learning_rate", factor)
        for i in range(w.steps):
            rows = torch.randperm(batch.batch_size, generator=gen)[: w.batch_size]
            last = ctx.train("actor_train", {k: v[rows] for k, v in batch.tensors.items()}, "sft")
            if i % 10 == 0 or i == w.steps - 1:
                ctx.log({f"warmup/{k}": v for k, v in last.items() if isinstance(v, int | float)},
                        -(w.steps - i))  # fmt: skip
        if factor != 1.0:
            actor.call_all("scale_learning_rate", 1.0 / factor)
        actor.call_all("reset_optimizer_state")
        ctx.sync_weights()
        return {"warmup/seconds": time.perf_counter() - t0, "warmup/demos": float(len(demos))}
