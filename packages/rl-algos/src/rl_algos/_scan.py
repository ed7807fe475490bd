"""Vectorised reverse scans over ``[B, T]`` used by GAE and discounted returns (internal)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

_BLOCK = 32


def _power_table(discount: float, n: int, dtype: torch.dtype, stride: int = 1) -> Tensor:
    """``[n]``: ``discount ** (stride * k)`` for ``k = 0..n-1``, computed in float64, with every
    power below ``dtype``'s smallest normal number set to 0 (a denormal operand makes the scan's
    matmuls ~15x slower on x86 CPUs; what it would add is below ``1.2e-38 * |x|`` in float32)."""
    exponents = torch.arange(n, dtype=torch.float64) * stride
    out = torch.pow(torch.tensor(discount, dtype=torch.float64), exponents)
    out = torch.where(out < torch.finfo(dtype).tiny, 0.0, out)
    return out.to(dtype)


def _powers(table: Tensor, exponents: Tensor, valid: Tensor) -> Tensor:
    """``table[exponents]`` where ``valid``, else 0 (``exponents`` indexes ``table``)."""
    out = table[exponents.clamp(min=0)]
    return torch.where(valid, out, torch.zeros_like(out))


@functools.lru_cache(maxsize=64)
def _scan_matrices(
    discount: float, length: int, nb: int, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor, Tensor]:
    """The scan's constants (cached: a step computes GAE and returns with the same few shapes):
    ``decay [L, L]`` (``discount**(j - i)`` for ``j >= i``), ``carry_mat [nb, nb]``
    (``discount**(L * (b' - b - 1))`` for ``b' > b``) and ``tail [L]`` (``discount**(L - i)``).
    Never written to by callers; made outside inference mode, so a later autograd call can use
    them."""
    with torch.inference_mode(False):
        i = torch.arange(length)
        diff = i[None, :] - i[:, None]  # [i, j] = j - i
        steps = _power_table(discount, length + 1, dtype)  # discount**0 .. **length
        decay = _powers(steps, diff, diff >= 0)
        k = torch.arange(nb)
        bdiff = k[None, :] - k[:, None]  # [b, b'] = b' - b
        blocks = _power_table(discount, nb, dtype, stride=length)
        carry_mat = _powers(blocks, bdiff - 1, bdiff > 0)
        tail = steps[length - i]
        return decay.to(device), carry_mat.to(device), tail.to(device)


def discounted_reverse_cumsum(x: Tensor, discount: float, block: int = _BLOCK) -> Tensor:
    """``out[:, t] = sum_{s >= t} discount**(s - t) * x[:, s]`` without a Python loop over T.

    Blocked two-level scan: within blocks of ``block`` steps a ``[block, block]`` upper-triangular
    decay matrix is applied by matmul; the carries between blocks are one ``[nb, nb]`` matmul.
    Powers that underflow (or would be denormal) become 0 (never divided by), so long horizons
    stay exact.

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
    decay, carry_mat, tail = _scan_matrices(discount, length, nb, x.dtype, x.device)
    local = xp @ decay.t()  # [B, nb, L]: local[i] = sum_j decay[i, j] x[j]
    if nb == 1:
        out = local
    else:
        carry = local[:, :, 0] @ carry_mat.t()  # [B, nb]: value at the start of block b + 1
        out = local.addcmul_(carry.unsqueeze(-1), tail)
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
