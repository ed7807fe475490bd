"""The offline preference recipe's parts (apps/dpo; its batches: rl_runtime.step.epochs): the
reference's summed log-probs (cached for the run or a forward per batch), KTO's reference point,
and the held-out loss and reward metrics."""

from __future__ import annotations

from typing import Any

import torch

from rl_algos.preference import get_preference_loss
from rl_runtime.pipelines.dpo.data import Example, collate
from rl_train.preference import preference_inputs, preference_metrics, sequence_logps

CHUNK = 256
"""Examples per reference forward when filling the cache."""


def reference_logps(ctx: Any, examples: list[Example], pad_token_id: int) -> torch.Tensor:
    """Summed reference log-probs `[E, rows per example]` of `examples` (forward in chunks)."""
    parts = []
    for i in range(0, len(examples), CHUNK):
        chunk = examples[i : i + CHUNK]
        t = collate(chunk, pad_token_id, list(range(i, i + len(chunk))))
        lp = ctx.forward("reference", t)["log_probs"]
        parts.append(sequence_logps(lp, t["response_mask"])[0])
    return torch.cat(parts).reshape(len(examples), -1)


def add_reference(
    ctx: Any,
    t: dict[str, torch.Tensor],
    examples: list[Example],
    cached: torch.Tensor | None,
    idx: list[int],
    pad_token_id: int,
) -> None:
    """`t["ref_logps"]` of the rows of `examples` (rows `idx` of the `cached` tensor, or a
    reference forward when the plan computes them on the fly); for an unpaired loss (KTO) also
    `t["kl_reference"]`, the detached batch KL estimate that is its reference point, and
    `t["desirable_total"]`, the batch's desirable row count (the desirable metrics' denominator)."""
    plan = ctx.components.preference
    if plan.reference == "cached":
        assert cached is not None, "reference='cached': the recipe fills the cache in setup"
        t["ref_logps"] = cached[torch.as_tensor(idx)].reshape(-1)
    elif plan.reference == "on_the_fly":
        t["ref_logps"] = reference_logps(ctx, examples, pad_token_id).reshape(-1)
    if not plan.loss.paired:
        lp = ctx.forward("actor_train", t)["log_probs"]
        policy = sequence_logps(lp, t["response_mask"])[0]
        kl = (policy - t["ref_logps"]).mean().clamp(min=0.0)
        t["kl_reference"] = kl.expand(policy.shape[0]).clone()
        total = t["desirable"].bool().sum().to(torch.float32)
        t["desirable_total"] = total.expand(policy.shape[0]).clone()


def held_out_metrics(ctx: Any, t: dict[str, torch.Tensor]) -> dict[str, float]:
    """The preference loss and reward metrics (`val/*`) of the policy on the rows `t` (with
    their reference log-probs), without training."""
    plan = ctx.components.preference
    lp = ctx.forward("actor_train", t)["log_probs"]
    sums, means = sequence_logps(lp, t["response_mask"])
    x, n = preference_inputs(t, sums, means, plan.loss)
    result = get_preference_loss(plan.loss.loss_type)(x, **plan.loss.options())
    total = t["desirable_total"][0] if "desirable_total" in t else None
    metrics = preference_metrics(
        result, x, float(n), paired=plan.loss.paired, desirable_total=total
    )
    out = {f"val/{k}": float(v) for k, v in metrics.items()}
    out["val/loss"] = float(result.losses.mean())
    return out
