"""The on-policy distillation recipe (ROLL's on-policy distill pipeline, verl's and NeMo-RL's
on-policy distillation, TRL's GKD) on rl_runtime.run.runner's Runner: apps/rlvr's recipe with
its learn step replaced.

One step: `rollout` (RLVR's: prompts from the resumable sampler -> G samples per prompt on the
student's actor_infer engines -> rewards, kept as the accuracy metric) then `learn`
(rl_runtime.pipelines.distill.step.learn_distill: the student's and the teachers' log-probs of
every sampled token -> per-token advantage = -kl_coef * reverse KL -> actor_train's policy loss
-> weight sync). Evaluation: RLVR's held-out accuracy. Before training: RLVR's optional
supervised warm-up of the student.
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
    def __init__(self, app: AppOptions, plan: DistillPlan, model_path: str) -> None:
        super().__init__(app, plan.rlvr, model_path)
        self.teachers = plan.teachers

    def learn(self, ctx: Context, batch: RolloutBatch) -> dict[str, float]:
        """Train the student toward its teachers on `batch` and sync the weights
        (rl_runtime.pipelines.distill.step.learn_distill); failed reward calls join the totals."""
        metrics = learn_distill(ctx, batch, self.teachers, pad_token_id=self.pad_token_id)
        metrics.update(add_batch_failures(batch.metrics, self.reward_failures))
        return metrics
