"""Vectorised reverse scans over ``[B, T]`` used by GAE and discounted returns (internal)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

_BLOCK = 32


def _powers(discount: float, exponents: Tensor, valid: Tensor, dtype: torch.dtype) -> Tensor:
    base = torch.tensor(discount, dtype=torch.float64, device=exponents.device)
    out = torch.pow(base, exponents.clamp(min=0).to(torch.float64))
    return torch.where(valid, out, torch.zeros_like(out)).to(dtype)


def discounted_reverse_cumsum(x: Tensor, discount: float, block: int = _BLOCK) -> Tensor:
    """``out[:, t] = sum_{s >= t} discount**(s - t) * x[:, s]`` without a Python loop over T.

    Blocked two-level scan: within blocks of ``block`` steps a ``[block, block]`` upper-triangular
    decay matrix is applied by matmul; the carries between blocks are one ``[nb, nb]`` matmul.
    Powers that underflow become 0 (never divided by), so long horizons stay exact.

    Args:
        x: ``[B, T]`` float.
    Returns:
        ``[B, T]`` same dtype.
    """
    if x.dim() != 2:
        raise ValueError(f"expected [B, T], got {tuple(x.shape)}")
    if discount < 0.0:
        raise ValueError(f"discount must be >= 0, got {discount}")
    b, t = x.shape
    if t == 0 or b == 0:
        return x.clone()
    length = min(block, t)
    nb = -(-t // length)
    pad = nb * length - t
    xp = F.pad(x, (0, pad)).view(b, nb, length) if pad else x.reshape(b, nb, length)
    i = torch.arange(length, device=x.device)
    diff = i[None, :] - i[:, None]  # [i, j] = j - i
    decay = _powers(discount, diff, diff >= 0, x.dtype)  # local[i] = sum_j decay[i, j] x[j]
    local = xp @ decay.t()  # [B, nb, L]
    if nb == 1:
        out = local
    else:
        k = torch.arange(nb, device=x.device)
        bdiff = k[None, :] - k[:, None]  # [b, b'] = b' - b
        carry_mat = _powers(discount, length * (bdiff - 1), bdiff > 0, x.dtype)
        carry = local[:, :, 0] @ carry_mat.t()  # [B, nb]: value at the start of block b + 1
        tail = _powers(discount, length - i, torch.ones_like(i, dtype=torch.bool), x.dtype)
        out = torch.addcmul(local, carry.unsqueeze(-1), tail)
    return out.reshape(b, nb * length)[:, :t]


def compaction(mask: Tensor) -> tuple[Tensor, Tensor]:
    """Left-compaction indices of the True entries of each row.

    Returns:
        ``(slot [B, T], rank [B, T])``: ``slot`` is the compacted column of each True entry and
        ``T`` (a trash column) for False entries; ``rank`` is the compacted column clamped at 0,
        usable with ``gather`` to read compacted results back.
    """
    t = mask.shape[1]
    rank = mask.cumsum(1) - 1
    slot = torch.where(mask, rank, torch.full_like(rank, t))
    return slot, rank.clamp(min=0)


def compact(x: Tensor, slot: Tensor) -> Tensor:
    """Scatter the masked entries of ``x`` [B, T] to the left; the rest of each row is 0."""
    b, t = x.shape
    out = x.new_zeros(b, t + 1)
    out.scatter_(1, slot, x)
    return out[:, :t]


def masked_discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Discounted reward-to-go over the masked tokens of each row only (others are skipped).

    ``G[b, t] = sum_{s >= t, mask[b,s]} gamma**(#masked tokens in (t, s]) * r[b, s]`` at masked
    ``t``; 0 elsewhere.  Rewards at unmasked positions are ignored.

    Args:
        rewards: ``[B, T]``; mask: ``[B, T]`` bool.
    Returns:
        ``[B, T]``.
    """
    slot, rank = compaction(mask)
    out = discounted_reverse_cumsum(compact(rewards, slot), gamma).gather(1, rank)
    return torch.where(mask, out, torch.zeros_like(out))
