"""Off-policy, token-level distillation as the pipeline's step (`distill_app.mode: off_policy`;
ROLL's offline distill pipeline): the rows are given or the teacher's samples
(rl_runtime.pipelines.distill.off_policy), not the student's.

One step:
    rows          `off_policy.batch_size` rows of the epoch order (rl_runtime.step.epochs
                  .batch_index: a function of the step, so a resumed run continues)
    teacher       its role (`teacher_<name>`, rl-train's reference backend) gives its top-k
                  next-token distribution at every position (`logits_topk`, temperatures
                  `kd_temperature * teacher_temperature`), on its own workers
    student       actor_train, `train_step(loss="kd")`: its logits at the teacher's ids, the
                  `kd_objective` divergence masked to the trained tokens (the response; every
                  token but the first with `distill_on_prompt`), plus (1 - distill_loss_weight)
                  x the NLL (rl_runtime.step.losses.kd_loss_fn); `loss: sft` trains the NLL only
    sync          the weights to the engines (held-out accuracy samples from them)
"""

from __future__ import annotations

from typing import Any

import torch

from rl_runtime.pipelines.distill.off_policy import OffPolicyOptions
from rl_runtime.step.policy_update import prefixed


def teacher_topk(
    ctx: Any, role: str, tensors: dict[str, torch.Tensor], k: int, temperature: float
) -> dict[str, torch.Tensor]:
    """`role`'s top-k distribution at every position of `tensors`, rows sharded over its
    ranks and merged back (`TrainWorker.forward_topk`)."""
    from rl_runtime.step.collate import merge_rows, shard_rows

    group = ctx.cluster[role]
    shards = shard_rows(tensors, len(group.workers))
    outs = group.wait(group.submit_each("forward_topk", [(s, k, temperature) for s in shards]),
                      "forward_topk")  # fmt: skip
    return merge_rows(outs)


def trained_mask(tensors: dict[str, torch.Tensor], on_prompt: bool) -> torch.Tensor:
    """`[B, T]` bool: the rows' response tokens, or (`on_prompt`) every real token but the
    first (nothing predicts it)."""
    if not on_prompt:
        return tensors["response_mask"].bool()
    mask = tensors["attention_mask"].bool().clone()
    mask[:, 0] = False
    return mask


def kd_step(
    ctx: Any, examples: list, options: OffPolicyOptions, teacher_role: str, pad_token_id: int
) -> dict[str, float]:
    """Step `ctx.step` of off-policy distillation on `examples` (rl_runtime.step.sft_data
    `SFTExample`s); `distill/*` (with `loss: kd`: the forward and reverse KL of the student to
    the teacher on the trained tokens, before this step's update), `train/*`, `sync/*`."""
    from rl_runtime.step.epochs import batch_index
    from rl_runtime.step.sft_data import collate

    per_step = min(options.batch_size, len(examples))
    rows = batch_index(len(examples), per_step, ctx.components.seed, ctx.step)
    t = collate([examples[i] for i in rows], pad_token_id)
    t["response_mask"] = trained_mask(t, options.distill_on_prompt)
    ctx.cluster.enter_phase("train")
    metrics: dict[str, float] = {"distill/rows": float(len(rows)),
                                 "distill/tokens": float(t["response_mask"].sum())}  # fmt: skip
    if options.loss == "kd":
        with ctx.timer.phase("teacher_topk"):
            t.update(teacher_topk(ctx, teacher_role, t, options.logits_topk,
                                  options.kd_temperature * options.teacher_temperature))  # fmt: skip
    with ctx.timer.phase("actor_train"):
        trained = ctx.train("actor_train", t, options.loss)
    metrics.update(prefixed(trained, "train/"))
    for name in ("forward_kl", "reverse_kl", "kd_loss", "sft_nll"):
        if f"actor/{name}" in trained:
            metrics[f"distill/{name}"] = float(trained[f"actor/{name}"])
    with ctx.timer.phase("sync"):
        metrics.update(ctx.sync_weights())
    metrics.update(ctx.timer.metrics())
    return metrics
