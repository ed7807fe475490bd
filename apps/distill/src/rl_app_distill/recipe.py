"""The on-policy distillation recipe (ROLL's on-policy distill pipeline, verl's and NeMo-RL's
on-policy distillation, TRL's GKD) on rl_runtime.run.runner's Runner: apps/rlvr's recipe with
its learn step replaced.

One step: `rollout` (RLVR's: prompts from the resumable sampler -> G samples per prompt on the
student's actor_infer engines -> rewards, kept as the accuracy metric) then `learn`
(rl_runtime.pipelines.distill.step.learn_distill: the student's and the teachers' log-probs of
every sampled token -> per-token advantage = -kl_coef * reverse KL -> actor_train's policy loss
-> weight sync). Evaluation: RLVR's held-out accuracy. Before training: RLVR's optional
supervised warm-up of the student, or off-policy distillation (`distill_app.off_policy`).
"""

from __future__ import annotations

from rl_app_distill.compose import DistillPlan
from rl_app_distill.options import AppOptions
from rl_app_rlvr.recipe import RlvrRecipe
from rl_runtime.asynchrony.queue import RolloutBatch
from rl_runtime.pipelines.distill.step import learn_distill
from rl_runtime.pipelines.rlvr.metrics import add_batch_failures
from rl_runtime.run.context import Context

STDOUT_KEYS = ("distill/reverse_kl", "reward/accuracy", "val/greedy/accuracy", "val/pass@k",
               "response/length_mean", "train/pg_loss", "timing/step")  # fmt: skip
PROGRESS_KEYS = ("distill/reverse_kl", "reward/accuracy", "val/accuracy")


class DistillRecipe(RlvrRecipe):
    app: AppOptions

    def __init__(self, app: AppOptions, plan: DistillPlan, model_path: str) -> None:
        super().__init__(app, plan.rlvr, model_path)
        self.teachers = plan.teachers

    def before_training(self, ctx: Context) -> dict[str, float]:
        """Off-policy distillation (`distill_app.off_policy`: SFT on given data or on the
        teacher's samples), else RLVR's supervised warm-up."""
        from rl_runtime.pipelines.distill import off_policy as off

        options = self.app.off_policy
        if options.source == "none":
            return super().before_training(ctx)
        if options.source == "data":
            examples, counts = off.given_examples(options, self.tokenizer)
        else:
            from rl_runtime.run.model_source import resolve_model

            first = self.teachers.teachers[0]
            path = resolve_model(first.model_path, key=f"distill_app.teachers.{first.name}.model")
            examples = off.teacher_examples(options, path, self.prompts.train.ids,
                                            self.tokenizer, self.plan.response_length,
                                            ctx.components.seed)  # fmt: skip
            counts = {"examples": len(examples)}
        metrics = off.train_off_policy(ctx, examples, options, self.pad_token_id)
        return {**metrics, **{f"warmup/off_policy_{k}": float(v) for k, v in counts.items()}}

    def learn(self, ctx: Context, batch: RolloutBatch) -> dict[str, float]:
        """Train the student toward its teachers on `batch` and sync the weights
        (rl_runtime.pipelines.distill.step.learn_distill); failed reward calls join the totals."""
        metrics = learn_distill(ctx, batch, self.teachers, pad_token_id=self.pad_token_id)
        metrics.update(add_batch_failures(batch.metrics, self.reward_failures))
        return metrics
