"""The supervised fine-tuning recipe (ROLL's SFT pipeline) on rl_runtime.run.runner's Runner.

Setup: tokenize the training and held-out files once (rl_runtime.step.sft_data: loss on the
assistant turns only). One step: the next batch of the seeded epoch order (a function of the
step alone: a resumed run continues at the next batch) -> right-padded rows -> one actor_train
train_step with the supervised loss (`"sft"`: rl_runtime.step.losses.sft_loss_fn, the loss the
agentic and RLVR warm-ups train with; packed when `use_sequence_packing`). Evaluation: the
held-out token-mean loss and perplexity (rl_runtime.pipelines.sft.step.held_out_loss).
"""

from __future__ import annotations

from typing import Any

from rl_app_sft.options import AppOptions
from rl_envs.tasks import require_files
from rl_runtime.pipelines.sft.step import held_out_loss
from rl_runtime.run.context import Context
from rl_runtime.run.recipe import Recipe
from rl_runtime.step.epochs import batch_index, batch_position
from rl_runtime.step.sft_data import SFTSet, collate, load_sft

STDOUT_KEYS = ("train/loss", "val/loss", "val/perplexity", "train/grad_norm", "timing/step")


class SFTRecipe(Recipe):
    def __init__(self, app: AppOptions, model_path: str) -> None:
        self.app = app
        self.model_path = model_path
        self.pad_token_id = 0
        self.train: SFTSet | None = None
        self.held_out: SFTSet | None = None
        self.plan: Any = None
        self.seed = 0

    def setup(self, ctx: Context) -> None:
        from transformers import AutoTokenizer

        plan = self.plan = ctx.components.sft
        self.seed = ctx.components.seed
        tok = AutoTokenizer.from_pretrained(self.model_path)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.pad_token_id = int(pad or 0)
        require_files("actor_train.data_args.file_name", plan.train_files)
        self.train = load_sft(plan.train_files, tok, plan.fields)
        if len(self.train.examples) < plan.examples_per_step:
            raise ValueError(
                f"{len(self.train.examples)} training examples < one batch of "
                f"{plan.examples_per_step} (per_device_train_batch_size x accumulation x ranks)"
            )
        counts = {f"train/data_{k}": float(v) for k, v in self.train.counts.items()}
        if plan.eval_files:
            require_files("validation.data_args.file_name", plan.eval_files)
            self.held_out = load_sft(plan.eval_files, tok, plan.eval_fields)
            counts.update({f"val/data_{k}": float(v) for k, v in self.held_out.counts.items()})
        ctx.log(counts, step=0)

    def step(self, ctx: Context) -> dict[str, float]:
        assert self.train is not None
        n, per_step = len(self.train.examples), self.plan.examples_per_step
        idx = batch_index(n, per_step, self.seed, ctx.step)
        batch = collate([self.train.examples[i] for i in idx], self.pad_token_id)
        with ctx.timer.phase("actor_train"):
            out = ctx.train("actor_train", batch, "sft")
        metrics = {
            "train/" + k.split("/", 1)[-1]: float(v)
            for k, v in out.items()
            if isinstance(v, int | float)
        }
        metrics["train/loss"] = metrics.pop("train/sft_nll", metrics.get("train/loss", 0.0))
        metrics["train/tokens"] = float(batch["response_mask"].sum())
        metrics["train/epoch"] = float(batch_position(n, per_step, ctx.step)[0])
        metrics.update(ctx.timer.metrics())
        return metrics

    def evaluate(self, ctx: Context) -> dict[str, float]:
        if self.held_out is None:
            return {}
        return held_out_loss(ctx, self.held_out.examples, self.pad_token_id)

    def state(self) -> dict[str, Any]:
        return {"examples": len(self.train.examples) if self.train else 0}

    def load_state(self, state: dict[str, Any]) -> None:
        if self.train is not None and state.get("examples") not in (None, len(self.train.examples)):
            raise ValueError(
                f"the checkpoint was trained on {state['examples']} examples, the data now has "
                f"{len(self.train.examples)}: resuming would not continue at the next batch"
            )
