"""The on-policy distillation recipe (ROLL's on-policy distill pipeline, verl's and NeMo-RL's
on-policy distillation, TRL's GKD) on rl_runtime.run.runner's Runner: apps/rlvr's recipe with
its learn step replaced.

One step: `rollout` (RLVR's: prompts from the resumable sampler -> G samples per prompt on the
student's actor_infer engines -> rewards, kept as the accuracy metric) then `learn`
(rl_runtime.pipelines.distill.step.learn_distill: the student's and the teachers' log-probs of
every sampled token -> per-token advantage = -kl_coef * reverse KL -> actor_train's policy loss
-> weight sync). Evaluation: RLVR's held-out accuracy. Before training: RLVR's optional
supervised warm-up of the student, or off-policy distillation (`distill_app.off_policy`).

`distill_app.mode: off_policy`: the steps are off-policy distillation instead (no sampling but
the evaluations'): each trains on a batch of `off_policy`'s rows, token-level KL to the
teacher's logits with `loss: kd` (rl_runtime.pipelines.distill.kd).
"""

from __future__ import annotations

from rl_app_distill.compose import DistillPlan
from rl_app_distill.options import AppOptions
from rl_app_rlvr.recipe import RlvrRecipe
from rl_runtime.asynchrony.queue import RolloutBatch
from rl_runtime.pipelines.distill.step import learn_distill
from rl_runtime.pipelines.rlvr.metrics import add_batch_failures
from rl_runtime.run.context import Context

STDOUT_KEYS = ("distill/reverse_kl", "distill/forward_kl", "reward/accuracy", "val/greedy/accuracy", "val/pass@k",
               "response/length_mean", "train/pg_loss", "timing/step")  # fmt: skip
PROGRESS_KEYS = ("distill/reverse_kl", "reward/accuracy", "val/accuracy")


class DistillRecipe(RlvrRecipe):
    app: AppOptions

    def __init__(self, app: AppOptions, plan: DistillPlan, model_path: str) -> None:
        super().__init__(app, plan.rlvr, model_path)
        self.teachers = plan.teachers

    def setup(self, ctx: Context) -> None:
        """RLVR's setup; with `mode: off_policy`, the rows every step trains on (given, or the
        teacher's samples: a function of the seed, so a resumed run has the same) and, with
        `loss: kd`, actor_train's distillation loss."""
        super().setup(ctx)
        self.off_policy_rows: list = []
        self.off_policy_counts: dict[str, int] = {}
        if self.app.mode == "off_policy":
            self.off_policy_rows, self.off_policy_counts = self._off_policy_examples(ctx)
            if self.app.off_policy.loss == "kd":
                ctx.cluster["actor_train"].call_all("set_distill_loss",
                                                    self.app.off_policy.kd_config())  # fmt: skip

    def _off_policy_examples(self, ctx: Context) -> tuple[list, dict[str, int]]:
        """`distill_app.off_policy`'s rows: given, or the first teacher's samples."""
        from rl_runtime.pipelines.distill import off_policy as off

        options = self.app.off_policy
        if options.source == "data":
            return off.given_examples(options, self.tokenizer)
        from rl_runtime.run.model_source import resolve_model

        first = self.teachers.teachers[0]
        path = resolve_model(first.model_path, key=f"distill_app.teachers.{first.name}.model")
        examples = off.teacher_examples(options, path, self.prompts.train.ids, self.tokenizer,
                                        self.plan.response_length, ctx.components.seed)  # fmt: skip
        return examples, {"examples": len(examples)}

    def before_training(self, ctx: Context) -> dict[str, float]:
        """Mode on_policy: off-policy distillation first (`distill_app.off_policy`: SFT on given
        data or on the teacher's samples), else RLVR's supervised warm-up. Mode off_policy:
        RLVR's warm-up (the steps are the off-policy training)."""
        from rl_runtime.pipelines.distill import off_policy as off

        options = self.app.off_policy
        if self.app.mode == "off_policy":
            counts = {f"warmup/off_policy_{k}": float(v) for k, v in self.off_policy_counts.items()}
            return {**super().before_training(ctx), **counts}
        if options.source == "none":
            return super().before_training(ctx)
        examples, counts = self._off_policy_examples(ctx)
        metrics = off.train_off_policy(ctx, examples, options, self.pad_token_id)
        return {**metrics, **{f"warmup/off_policy_{k}": float(v) for k, v in counts.items()}}

    def step(self, ctx: Context) -> dict[str, float]:
        """Mode off_policy: a step of `off_policy`'s rows (rl_runtime.pipelines.distill.kd);
        else RLVR's (the student samples, then `learn`)."""
        if self.app.mode != "off_policy":
            return super().step(ctx)
        from rl_runtime.pipelines.distill.kd import kd_step

        return kd_step(ctx, self.off_policy_rows, self.app.off_policy,
                       self.teachers.teachers[0].role, self.pad_token_id)  # fmt: skip

    def learn(self, ctx: Context, batch: RolloutBatch) -> dict[str, float]:
        """Train the student toward its teachers on `batch` and sync the weights
        (rl_runtime.pipelines.distill.step.learn_distill); failed reward calls join the totals."""
        metrics = learn_distill(ctx, batch, self.teachers, pad_token_id=self.pad_token_id)
        metrics.update(add_batch_failures(batch.metrics, self.reward_failures))
        return metrics
