"""Masked reductions and loss aggregation over ``[B, T]`` token matrices.

Every function takes a boolean (or 0/1) ``mask`` aligned with the value tensor; tokens where the mask
is False never contribute.  Empty masks reduce to 0 instead of NaN.

``aggregate`` implements the four ``loss_agg_mode`` values shared by ROLL and verl:

- ``token-mean``:               sum_{b,t} L[b,t] m[b,t] / sum_{b,t} m[b,t]            (DAPO, arXiv:2503.14476)
- ``seq-mean-token-sum``:       mean_b sum_t L[b,t] m[b,t]
- ``seq-mean-token-mean``:      mean_b (sum_t L[b,t] m[b,t] / sum_t m[b,t])          (GRPO, arXiv:2402.03300)
- ``seq-mean-token-sum-norm``:  mean_b sum_t L[b,t] m[b,t] / norm_constant          (Dr.GRPO, arXiv:2503.20783)

Sequence means run over rows with at least one valid token.  For data parallelism pass the
*global* denominators (``global_token_count`` for token-mean, ``global_seq_count`` for the seq-*
modes): each rank's result is then its share, and the sum over ranks equals the single-process
value (pass ``world_size`` too when the backend *averages* gradients over ranks).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

__all__ = [
    "LossAggMode",
    "aggregate",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]

LossAggMode = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)


def _mask_like(values: Tensor, mask: Tensor) -> Tensor:
    if mask.shape != values.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != values shape {tuple(values.shape)}")
    return mask.to(values.dtype)


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values`` where ``mask`` is set.

    Args:
        values: ``[B, T]`` (any shape).
        mask: same shape as ``values``, bool or 0/1.
        dim: reduce this dimension only; ``None`` reduces everything to a scalar.
    Returns:
        scalar, or ``values`` with ``dim`` reduced.
    """
    if mask.shape != values.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != values shape {tuple(values.shape)}")
    if mask.dtype == torch.bool:
        prod = torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))
    else:
        m = mask.to(values.dtype)
        prod = torch.where(
            m != 0, values * m, torch.zeros((), dtype=values.dtype, device=values.device)
        )
    return prod.sum() if dim is None else prod.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over masked entries; 0 where nothing is masked in.

    Args:
        values: ``[B, T]`` (any shape).
        mask: same shape, bool or 0/1.
        dim: reduce this dimension only (``None``: all).
    Returns:
        scalar, or ``values`` with ``dim`` reduced (``[B]`` for ``dim=-1``).
    """
    m = _mask_like(values, mask)
    total = masked_sum(values, mask, dim)
    count = m.sum() if dim is None else m.sum(dim)
    return total / count.clamp(min=1.0)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the masked entries (two-pass, Bessel-corrected when ``unbiased``).

    Args:
        values: ``[B, T]``; mask: same shape.
    Returns:
        scalar; 0 when fewer than two entries (one for ``unbiased=False``) are masked in.
    """
    m = _mask_like(values, mask)
    mean = masked_mean(values, mask)
    sq = masked_sum((values - mean) ** 2, mask)
    n = m.sum()
    denom = (n - 1.0) if unbiased else n
    return torch.where(denom > 0, sq / denom.clamp(min=1.0), torch.zeros_like(sq))


def masked_whiten(
    values: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> Tensor:
    """Whitening ``(x - mean) / sqrt(var + eps)`` with statistics over masked entries.

    This is the ``masked_whiten`` of the PPO-for-LMs lineage (Ziegler et al. 2019; verl, ROLL).
    With ``shift_mean=False`` the mean is added back (scale only).  Masked-out entries are 0.

    Args:
        values: ``[B, T]``; mask: same shape.
    Returns:
        ``[B, T]``.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    out = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(mask.bool(), out, torch.zeros_like(out))


def aggregate(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    global_token_count: float | Tensor | None = None,
    global_seq_count: float | Tensor | None = None,
    norm_constant: float | None = None,
    world_size: int = 1,
) -> Tensor:
    """Reduce a per-token loss matrix to a scalar the way ``loss_agg_mode`` says.

    Args:
        loss_mat: ``[B, T]`` per-token losses.
        mask: ``[B, T]`` response mask (bool or 0/1).
        mode: one of ``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean``,
            ``seq-mean-token-sum-norm`` (see module docstring for the formulas).
        global_token_count: total valid tokens over all data-parallel ranks (token-mean); default
            the local count.
        global_seq_count: total non-empty sequences over all ranks (seq-* modes); default local.
        norm_constant: denominator of ``seq-mean-token-sum-norm`` (Dr.GRPO's constant, e.g. the
            maximum response length); default ``T`` (``loss_mat.shape[-1]``).
        world_size: multiply the result by this, for backends that average gradients over ranks.
    Returns:
        scalar tensor (differentiable w.r.t. ``loss_mat``).
    """
    if loss_mat.dim() != 2:
        raise ValueError(f"loss_mat must be [B, T], got shape {tuple(loss_mat.shape)}")
    m = _mask_like(loss_mat, mask)
    if mode == "token-mean":
        denom = m.sum() if global_token_count is None else global_token_count
        out = masked_sum(loss_mat, mask) / torch.as_tensor(denom, dtype=loss_mat.dtype).clamp(
            min=1.0
        )
    elif mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        tokens_per_seq = m.sum(-1)
        seq_sum = masked_sum(loss_mat, mask, dim=-1)
        if mode == "seq-mean-token-mean":
            seq_loss = seq_sum / tokens_per_seq.clamp(min=1.0)
        elif mode == "seq-mean-token-sum-norm":
            constant = float(loss_mat.shape[-1]) if norm_constant is None else float(norm_constant)
            if constant <= 0:
                raise ValueError(f"norm_constant must be > 0, got {constant}")
            seq_loss = seq_sum / constant
        else:
            seq_loss = seq_sum
        nonempty = tokens_per_seq > 0
        denom = nonempty.sum() if global_seq_count is None else global_seq_count
        out = (seq_loss * nonempty).sum() / torch.as_tensor(denom, dtype=loss_mat.dtype).clamp(
            min=1.0
        )
    else:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of {LOSS_AGG_MODES}")
    return out * world_size if world_size != 1 else out
