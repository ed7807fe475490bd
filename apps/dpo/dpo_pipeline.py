"""The offline preference recipe (ROLL's DPO pipeline) on rl_runtime.pipeline's Runner.

Setup: tokenize the preference files once (rl_runtime.preference_data), then, with
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
from dpo_options import AppOptions

from rl_algos.preference import get_preference_loss
from rl_runtime.pipeline import Context
from rl_runtime.preference_data import Example, PreferenceSet, collate, load_preferences
from rl_train.preference import preference_inputs, preference_metrics, sequence_logps

STDOUT_KEYS = (
    "train/loss",
    "train/rewards/accuracies",
    "train/rewards/margins",
    "val/rewards/accuracies",
    "val/greedy_correct",
    "timing/step",
)
CHUNK = 256  # examples per reference forward when filling the cache


class DPORecipe:
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
        self.train = load_preferences(plan.data.train_files, tok, plan.data, paired=paired)
        if len(self.train.examples) < plan.examples_per_step:
            raise ValueError(
                f"{len(self.train.examples)} training examples < one batch of "
                f"{plan.examples_per_step} (per_device_train_batch_size x accumulation x ranks)"
            )
        if plan.data.eval_files:
            self.held_out = load_preferences(plan.data.eval_files, tok, plan.data, paired=paired)
        if plan.reference == "cached":
            ctx.cluster.enter_phase("train")
            self.ref_cache["train"] = self.reference_logps(ctx, self.train.examples)
            if self.held_out is not None:
                self.ref_cache["val"] = self.reference_logps(ctx, self.held_out.examples)
        counts = {f"train/data_{k}": float(v) for k, v in self.train.counts.items()}
        if self.held_out is not None:
            counts.update({f"val/data_{k}": float(v) for k, v in self.held_out.counts.items()})
        ctx.log(counts, step=0)

    # ------------------------------------------------------------------------ batches
    def batch_index(self, step: int) -> list[int]:
        """Examples of pipeline step `step`: seeded epoch permutations, consumed in order (the
        last partial batch of an epoch is skipped)."""
        assert self.train is not None
        n = len(self.train.examples)
        per = self.plan.examples_per_step
        per_epoch = n // per
        epoch, k = divmod(step, per_epoch)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(n, generator=gen)[k * per : (k + 1) * per].tolist()

    def rows(self, examples: list[Example], ids: list[int]) -> dict[str, torch.Tensor]:
        return collate(examples, self.pad_token_id, ids)

    def reference_logps(self, ctx: Context, examples: list[Example]) -> torch.Tensor:
        """Summed reference log-probs `[E, rows per example]` of `examples` (forward in chunks)."""
        parts = []
        for i in range(0, len(examples), CHUNK):
            chunk = examples[i : i + CHUNK]
            t = self.rows(chunk, list(range(i, i + len(chunk))))
            lp = ctx.forward("reference", t)["log_probs"]
            parts.append(sequence_logps(lp, t["response_mask"])[0])
        return torch.cat(parts).reshape(len(examples), -1)

    def with_reference(
        self, ctx: Context, t: dict[str, torch.Tensor], split: str, idx: list[int], examples: list
    ) -> None:
        plan = ctx.components.preference
        if plan.reference == "cached":
            t["ref_logps"] = self.ref_cache[split][torch.as_tensor(idx)].reshape(-1)
        elif plan.reference == "on_the_fly":
            t["ref_logps"] = self.reference_logps(ctx, examples).reshape(-1)
        if not plan.loss.paired:  # KTO's reference point: detached batch KL estimate
            lp = ctx.forward("actor_train", t)["log_probs"]
            policy = sequence_logps(lp, t["response_mask"])[0]
            kl = (policy - t["ref_logps"]).mean().clamp(min=0.0)
            t["kl_reference"] = kl.expand(policy.shape[0]).clone()

    # ------------------------------------------------------------------------ protocol
    def step(self, ctx: Context) -> dict[str, float]:
        assert self.train is not None
        idx = self.batch_index(ctx.step)
        examples = [self.train.examples[i] for i in idx]
        t = self.rows(examples, idx)
        with ctx.timer.phase("reference"):
            self.with_reference(ctx, t, "train", idx, examples)
        with ctx.timer.phase("actor_train"):
            out = ctx.train("actor_train", t)
        metrics = {
            "train/" + k.split("/", 1)[1]: float(v)
            for k, v in out.items()
            if isinstance(v, int | float)
        }
        metrics["train/epoch"] = float(ctx.step * len(idx) // len(self.train.examples))
        metrics.update(ctx.timer.metrics())
        return metrics

    def evaluate(self, ctx: Context) -> dict[str, float]:
        if self.held_out is None:
            return {}
        t0 = time.perf_counter()
        plan = ctx.components.preference
        examples = self.held_out.examples
        idx = list(range(len(examples)))
        t = self.rows(examples, idx)
        self.with_reference(ctx, t, "val", idx, examples)
        lp = ctx.forward("actor_train", t)["log_probs"]
        sums, means = sequence_logps(lp, t["response_mask"])
        x, n = preference_inputs(t, sums, means, plan.loss)
        result = get_preference_loss(plan.loss.loss_type)(x, **plan.loss.options())
        out = {
            f"val/{k}": float(v)
            for k, v in preference_metrics(result, x, float(n), paired=plan.loss.paired).items()
        }
        out["val/loss"] = float(result.losses.mean())
        if self.app.greedy_eval_prompts and "answer" in examples[0].meta:
            from rl_runtime.dpo_arithmetic import greedy_correct

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


def summary_row(metrics: dict[str, float]) -> dict[str, float | str]:
    keys = ("rewards/accuracies", "rewards/margins", "loss", "greedy_correct")
    return {k: float(metrics[f"val/{k}"]) for k in keys if f"val/{k}" in metrics}
