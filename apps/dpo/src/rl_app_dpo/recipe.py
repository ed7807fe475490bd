"""The offline preference recipe (ROLL's DPO pipeline) on rl_runtime.run.runner's Runner.

Setup: tokenize the preference files once (rl_runtime.pipelines.dpo.data), then, with
`precompute_ref_log_probs`, the reference worker's summed log-probs of every row, cached for the
run (the reference is frozen, so every epoch would give the same values). One step: the next
batch of the seeded epoch order (a function of the step alone: a resumed run continues at the
next batch) -> paired rows (chosen/rejected interleaved) -> reference log-probs (cache or a
forward) -> one actor train_step (gradient accumulation over the full batch). Evaluation: the
same loss and reward metrics on every held-out pair, plus greedy answers when the rows carry one.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from rl_app_dpo.options import AppOptions
from rl_envs.tasks import require_files
from rl_runtime.pipelines.dpo.data import PreferenceSet, collate, load_preferences
from rl_runtime.pipelines.dpo.step import add_reference, held_out_metrics, reference_logps
from rl_runtime.run.context import Context
from rl_runtime.run.recipe import Recipe
from rl_runtime.step.epochs import batch_index, batch_position

STDOUT_KEYS = (
    "train/loss",
    "train/rewards/accuracies",
    "train/rewards/margins",
    "val/rewards/accuracies",
    "val/greedy_correct",
    "timing/step",
)


class DPORecipe(Recipe):
    def __init__(self, app: AppOptions, model_path: str) -> None:
        self.app = app
        self.model_path = model_path
        self.pad_token_id = 0
        self.eos_token_id = 0
        self.train: PreferenceSet | None = None
        self.held_out: PreferenceSet | None = None
        self.ref_cache: dict[str, torch.Tensor] = {}
        self.plan: Any = None
        self.seed = 0

    def setup(self, ctx: Context) -> None:
        from transformers import AutoTokenizer

        plan = self.plan = ctx.components.preference
        self.seed = ctx.components.seed
        tok = AutoTokenizer.from_pretrained(self.model_path)
        self.eos_token_id = int(tok.eos_token_id)
        self.pad_token_id = int(
            tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        )
        paired = plan.loss.paired
        require_files("actor_train.data_args.file_name", plan.data.train_files)
        self.train = load_preferences(plan.data.train_files, tok, plan.data, paired=paired)
        if len(self.train.examples) < plan.examples_per_step:
            raise ValueError(
                f"{len(self.train.examples)} training examples < one batch of "
                f"{plan.examples_per_step} (per_device_train_batch_size x accumulation x ranks)"
            )
        if plan.data.eval_files:
            require_files("actor_train.data_args.eval_file_name", plan.data.eval_files)
            self.held_out = load_preferences(plan.data.eval_files, tok, plan.data, paired=paired)
        if plan.reference == "cached":
            ctx.cluster.enter_phase("train")
            pad = self.pad_token_id
            self.ref_cache["train"] = reference_logps(ctx, self.train.examples, pad)
            if self.held_out is not None:
                self.ref_cache["val"] = reference_logps(ctx, self.held_out.examples, pad)
        counts = {f"train/data_{k}": float(v) for k, v in self.train.counts.items()}
        if self.held_out is not None:
            counts.update({f"val/data_{k}": float(v) for k, v in self.held_out.counts.items()})
        ctx.log(counts, step=0)

    # ------------------------------------------------------------------------ protocol
    def step(self, ctx: Context) -> dict[str, float]:
        assert self.train is not None
        n, per_step = len(self.train.examples), self.plan.examples_per_step
        idx = batch_index(n, per_step, self.seed, ctx.step)
        examples = [self.train.examples[i] for i in idx]
        t = collate(examples, self.pad_token_id, idx)
        with ctx.timer.phase("reference"):
            cached = self.ref_cache.get("train")
            add_reference(ctx, t, examples, cached, idx, self.pad_token_id)
        with ctx.timer.phase("actor_train"):
            out = ctx.train("actor_train", t)
        metrics = {
            "train/" + k.split("/", 1)[1]: float(v)
            for k, v in out.items()
            if isinstance(v, int | float)
        }
        metrics["train/epoch"] = float(batch_position(n, per_step, ctx.step)[0])
        metrics.update(ctx.timer.metrics())
        return metrics

    def evaluate(self, ctx: Context) -> dict[str, float]:
        if self.held_out is None:
            return {}
        t0 = time.perf_counter()
        examples = self.held_out.examples
        idx = list(range(len(examples)))
        t = collate(examples, self.pad_token_id, idx)
        add_reference(ctx, t, examples, self.ref_cache.get("val"), idx, self.pad_token_id)
        out = held_out_metrics(ctx, t)
        if self.app.greedy_eval_prompts and "answer" in examples[0].meta:
            from rl_runtime.pipelines.dpo.arithmetic import greedy_correct

            named = ctx.cluster["actor_train"].call_all("named_tensors")[0]
            shown = examples[: self.app.greedy_eval_prompts]
            out["val/greedy_correct"] = greedy_correct(
                self.model_path, named, shown, self.eos_token_id
            )
        out["timing/eval"] = time.perf_counter() - t0
        return out

    def state(self) -> dict[str, Any]:
        return {"examples": len(self.train.examples) if self.train else 0}

    def load_state(self, state: dict[str, Any]) -> None:
        if self.train is not None and state.get("examples") not in (None, len(self.train.examples)):
            raise ValueError(
                f"the checkpoint was trained on {state['examples']} examples, the data now has "
                f"{len(self.train.examples)}: resuming would not continue at the next batch"
            )
