"""Loss functions the runtime passes to train backends besides their configured RL loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl_algos.losses import sft_loss
from rl_train.args import LogprobSampling


def sft_loss_fn(batch: dict[str, torch.Tensor], out, ctx) -> tuple[torch.Tensor, dict]:
    """Supervised warm-up: mean negative log-likelihood of the `response_mask` tokens.

    Matches rl_train's `LossFn` (micro_batch, ForwardOutput, LossContext): the micro-batch sum is
    divided by the mini-batch's global token count, so accumulation reproduces the full mean.
    """
    nll = sft_loss(out.log_probs, batch["response_mask"])  # rl_algos: -log p on the mask
    loss = nll.loss("token-mean", global_token_count=float(ctx.global_tokens))
    return loss, {"sft_nll": loss.detach()}


# a supervised loss fits the model's own full distribution to the data, whatever temperature and
# truncation the rollout samples with (rl_train.losses.forward_sampling)
sft_loss_fn.logprob_sampling = LogprobSampling()  # type: ignore[attr-defined]


@dataclass(frozen=True)
class KDLossConfig:
    """Off-policy token-level distillation's loss (ROLL's offline distill keys): `objective`
    (`kd_objective`, a name of rl_algos.distill.KD_OBJECTIVES), `kd_temperature` (the student's
    logits are divided by it), `distill_loss_weight` w (loss = w * divergence + (1 - w) * the
    NLL of the data's tokens), `adaptive_kl_alpha`, `skew_lambda`."""

    objective: str = "forward_kl"
    kd_temperature: float = 1.0
    distill_loss_weight: float = 0.5
    adaptive_kl_alpha: float = 0.5
    skew_lambda: float = 0.1

    def __post_init__(self) -> None:
        from rl_algos.distill import KD_OBJECTIVES

        if self.objective not in KD_OBJECTIVES:
            raise ValueError(f"kd_objective={self.objective!r}: one of {sorted(KD_OBJECTIVES)}")
        if not 0 <= self.distill_loss_weight <= 1:
            raise ValueError(f"distill_loss_weight={self.distill_loss_weight}: must be in [0, 1]")
        if self.kd_temperature <= 0:
            raise ValueError(f"kd_temperature={self.kd_temperature}: must be > 0")
        if not 0 < self.skew_lambda < 1:
            raise ValueError(f"skew_lambda={self.skew_lambda}: must be in (0, 1)")
        if not 0 <= self.adaptive_kl_alpha <= 1:
            raise ValueError(f"adaptive_kl_alpha={self.adaptive_kl_alpha}: must be in [0, 1]")


TEACHER_LOG_PROBS = "teacher_topk_log_probs"
TEACHER_IDS = "teacher_topk_ids"
"""The batch keys of the teacher's top-k distribution (`[B, T, k]`, aligned with the tokens)."""


def kd_loss_fn(cfg: KDLossConfig):
    """rl_train `LossFn` of token-level distillation: at every `response_mask` position, the
    student's logits at the teacher's top-k ids (`batch[TEACHER_IDS]`, rl_train's `logits_at`)
    against the teacher's log-probs there (`batch[TEACHER_LOG_PROBS]`): `w * divergence + (1 - w)
    * NLL`, each a token mean over the mini-batch's global count (ROLL's offline distill loss).
    Metrics: `kd_loss`, `sft_nll`, and the forward and reverse KL on those tokens (whatever the
    objective), `forward_kl`, `reverse_kl`."""
    from rl_algos.distill import kd_divergence, kd_loss

    def loss_fn(batch: dict[str, torch.Tensor], out, ctx) -> tuple[torch.Tensor, dict]:
        mask = batch["response_mask"].bool()
        teacher = batch[TEACHER_LOG_PROBS]
        count = float(ctx.global_tokens)
        kwargs = {"kd_temperature": cfg.kd_temperature, "adaptive_kl_alpha": cfg.adaptive_kl_alpha,
                  "skew_lambda": cfg.skew_lambda}  # fmt: skip
        div = kd_divergence(out.logits_at, teacher, cfg.objective, **kwargs)
        kd = kd_loss(div, mask, count)
        nll = kd_loss(-out.log_probs, mask, count)
        w = cfg.distill_loss_weight
        metrics = {"kd_loss": kd.detach(), "sft_nll": nll.detach()}
        with torch.no_grad():
            for name in ("forward_kl", "reverse_kl"):
                metrics[name] = kd_loss(
                    kd_divergence(out.logits_at.detach(), teacher, name, **kwargs), mask, count
                )
        return w * kd + (1 - w) * nll, metrics

    loss_fn.logprob_sampling = LogprobSampling()  # type: ignore[attr-defined]
    loss_fn.logits_at = TEACHER_IDS  # type: ignore[attr-defined]
    return loss_fn
