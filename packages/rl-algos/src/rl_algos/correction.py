"""Train/inference mismatch correction (rollout engine vs trainer log-probs).

``log_ratio = old_log_probs - rollout_log_probs`` (trainer over engine, both under the same
weights) is clamped to ±20 before ``exp``.

- truncated IS (TIS; Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy
  RL training"): ``w = min(r, C)`` per token, or per sequence with ``r = exp(sum log r)`` or the
  geometric mean ``exp(mean log r)``;
- masked IS (MIS / IcePop-style token filtering; Liu et al. 2025): tokens (or sequences) whose
  ratio leaves ``[low, high]`` are dropped from the loss mask instead of reweighted.

Weights are detached; use them as ``is_weights=`` of any policy loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from rl_algos.aggregate import masked_mean, masked_sum
from rl_algos.losses import LOG_RATIO_CLAMP

__all__ = ["ISCorrection", "masked_is", "mismatch_metrics", "truncated_is"]

LEVELS = ("token", "sequence", "geometric")


@dataclass(frozen=True)
class ISCorrection:
    """``weights [B, T]`` (detached, 0 off-mask), ``mask [B, T]`` (possibly reduced), ``stats``."""

    weights: Tensor
    mask: Tensor
    stats: dict[str, Tensor] = field(default_factory=dict)


def _log_ratio(old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor) -> Tensor:
    if old_log_probs.shape != rollout_log_probs.shape or mask.shape != old_log_probs.shape:
        raise ValueError(
            f"old_log_probs {tuple(old_log_probs.shape)}, rollout_log_probs "
            f"{tuple(rollout_log_probs.shape)} and response_mask {tuple(mask.shape)} must match"
        )
    lr = old_log_probs.detach().float() - rollout_log_probs.detach().float()
    return torch.where(mask, lr, torch.zeros_like(lr)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _level_log_ratio(lr: Tensor, mask: Tensor, level: str) -> Tensor:
    if level == "token":
        return lr
    if level == "sequence":
        return lr.sum(-1, keepdim=True).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).expand_as(lr)
    if level == "geometric":
        return masked_mean(lr, mask, dim=-1).unsqueeze(-1).expand_as(lr)
    raise ValueError(f"unknown IS level {level!r}; expected one of {LEVELS}")


def truncated_is(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    response_mask: Tensor,
    *,
    level: str = "token",
    threshold: float = 2.0,
) -> ISCorrection:
    """Truncated importance-sampling weights ``min(pi_train / pi_rollout, threshold)``.

    Args:
        old_log_probs: ``[B, T]`` trainer log-probs of the sampled tokens.
        rollout_log_probs: ``[B, T]`` engine log-probs.
        response_mask: ``[B, T]``.
        level: ``token``, ``sequence`` (product) or ``geometric`` (mean log ratio).
    Returns:
        ``ISCorrection`` (mask unchanged) with stats ``is_weight_mean``, ``is_truncated_frac``.
    """
    mask = response_mask.bool()
    lr = _level_log_ratio(_log_ratio(old_log_probs, rollout_log_probs, mask), mask, level)
    ratio = lr.exp()
    w = torch.where(mask, ratio.clamp(max=threshold), torch.zeros_like(ratio))
    stats = {
        "is_weight_mean": masked_mean(w, mask),
        "is_truncated_frac": masked_mean((ratio > threshold).float(), mask),
    }
    return ISCorrection(w, mask, stats)


def masked_is(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    response_mask: Tensor,
    *,
    level: str = "token",
    low: float = 0.5,
    high: float = 2.0,
    reweight: bool = False,
) -> ISCorrection:
    """Masked IS: drop tokens (or whole sequences) whose ratio is outside ``[low, high]``.

    Args:
        old_log_probs, rollout_log_probs, response_mask: ``[B, T]``.
        level: ``token``, ``sequence`` or ``geometric``.
        reweight: also return the ratio as weight on kept tokens (else weight 1).
    Returns:
        ``ISCorrection`` with the reduced ``mask``; stats ``is_masked_frac``.
    """
    if not 0 <= low < high:
        raise ValueError(f"need 0 <= low < high, got low={low}, high={high}")
    mask = response_mask.bool()
    lr = _level_log_ratio(_log_ratio(old_log_probs, rollout_log_probs, mask), mask, level)
    ratio = lr.exp()
    keep = mask & (ratio >= low) & (ratio <= high)
    w = torch.where(keep, ratio if reweight else torch.ones_like(ratio), torch.zeros_like(ratio))
    stats = {"is_masked_frac": masked_mean((~keep).float(), mask)}
    return ISCorrection(w, keep, stats)


def mismatch_metrics(
    old_log_probs: Tensor, rollout_log_probs: Tensor, response_mask: Tensor
) -> dict[str, Tensor]:
    """Detached train/inference mismatch metrics over the masked tokens.

    Returns keys: ``mismatch_k1`` (mean ``log pi_rollout - log pi_train``, a KL(rollout||train)
    estimate), ``mismatch_k3`` (``r - log r - 1`` with ``r = pi_train/pi_rollout``),
    ``mismatch_abs_log_ratio``, ``mismatch_max_ratio``, ``mismatch_min_ratio``,
    ``mismatch_seq_max_abs_log_ratio``, ``mismatch_ppl_train``, ``mismatch_ppl_rollout``.
    """
    mask = response_mask.bool()
    lr = _log_ratio(old_log_probs, rollout_log_probs, mask)
    big = torch.full_like(lr, LOG_RATIO_CLAMP)
    if mask.any():
        max_lr = torch.where(mask, lr, -big).amax()
        min_lr = torch.where(mask, lr, big).amin()
    else:
        max_lr = min_lr = lr.new_zeros(())
    seq_abs = masked_sum(lr, mask, dim=-1).abs()
    return {
        "mismatch_k1": masked_mean(-lr, mask),
        "mismatch_k3": masked_mean(lr.exp() - lr - 1.0, mask),
        "mismatch_abs_log_ratio": masked_mean(lr.abs(), mask),
        "mismatch_max_ratio": max_lr.exp(),
        "mismatch_min_ratio": min_lr.exp(),
        "mismatch_seq_max_abs_log_ratio": seq_abs.amax() if seq_abs.numel() else lr.new_zeros(()),
        "mismatch_ppl_train": torch.exp(-masked_mean(old_log_probs.detach().float(), mask)),
        "mismatch_ppl_rollout": torch.exp(-masked_mean(rollout_log_probs.detach().float(), mask)),
    }
