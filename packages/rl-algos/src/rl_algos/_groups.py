"""Group bookkeeping for outcome estimators: ids from any index, vectorised group statistics."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from functools import lru_cache
from typing import Union

import torch
from torch import Tensor

GroupIndex = Union[Tensor, Sequence[Hashable]]  # noqa: UP007 - readable alias


def group_ids(index: GroupIndex, batch_size: int, device: torch.device) -> tuple[Tensor, int]:
    """Map a per-row group key to dense-enough int64 ids.

    Args:
        index: ``[B]`` int tensor, or a length-``B`` sequence of hashables (str, int, tuple...).
        batch_size: ``B``; a length mismatch raises ``ValueError``.
    Returns:
        ``(ids [B] int64 on device, num_groups)`` with ``0 <= ids < num_groups`` (some ids may be
        unused when a non-negative int tensor is passed through unchanged).
    """
    if isinstance(index, Tensor):
        if index.dim() != 1 or index.shape[0] != batch_size:
            raise ValueError(f"index must be [B={batch_size}], got shape {tuple(index.shape)}")
        if batch_size == 0:
            return index.to(device=device, dtype=torch.long), 0
        if not index.is_floating_point() and not index.is_complex() and index.dtype != torch.bool:
            lo_t, hi_t = torch.aminmax(index)
            lo, hi = int(lo_t), int(hi_t)
            if lo >= 0 and hi < 4 * batch_size + 1024:
                if index.dtype != torch.long or index.device != device:
                    index = index.to(device=device, dtype=torch.long)
                return index, hi + 1
        uniq, inv = torch.unique(index, return_inverse=True)
        return inv.to(device=device, dtype=torch.long), int(uniq.numel())
    if isinstance(index, (str, bytes)):
        raise TypeError("index must be a tensor or a sequence of per-row group keys, not a string")
    keys = list(index)
    if len(keys) != batch_size:
        raise ValueError(f"index has {len(keys)} entries but the batch has B={batch_size} rows")
    mapping: dict[Hashable, int] = {}
    ids = [mapping.setdefault(k, len(mapping)) for k in keys]
    return torch.tensor(ids, dtype=torch.long, device=device), len(mapping)


def group_sum(x: Tensor, ids: Tensor, num_groups: int) -> Tensor:
    """Per-group sum of ``x`` [B] -> ``[G]``."""
    return x.new_zeros(num_groups).index_add_(0, ids, x)


def group_count_mean(x: Tensor, ids: Tensor, num_groups: int) -> tuple[Tensor, Tensor]:
    """Per-group (count, mean) of ``x`` [B] -> ``([G], [G])`` (mean 0 for empty groups)."""
    count = torch.bincount(ids, minlength=num_groups).to(x.dtype)
    return count, group_sum(x, ids, num_groups) / count.clamp(min=1.0)


def group_stats(x: Tensor, ids: Tensor, num_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group (count, mean, unbiased std) of ``x`` [B], two-pass for accuracy.

    Returns:
        ``(count [G], mean [G], std [G])``; std is 0 for groups of one row.
    """
    count, mean = group_count_mean(x, ids, num_groups)
    dev = x - mean.index_select(0, ids)
    var = group_sum(dev * dev, ids, num_groups) / (count - 1.0).clamp(min=1.0)
    return count, mean, var.sqrt()


@lru_cache(maxsize=4)
def _consecutive_ids(num_groups: int, size: int, device: torch.device) -> Tensor:
    """``[0]*size + [1]*size + ... + [num_groups-1]*size`` [B] (cached, read-only: compared only)."""
    return torch.arange(num_groups, device=device).repeat_interleave(size)


def consecutive_group_size(ids: Tensor, num_groups: int) -> int:
    """``k`` when ``ids`` [B] is ``[0]*k + [1]*k + ... + [G-1]*k`` with ``k >= 2``, else 0.

    This is the layout rollouts emit (the ``k`` samples of a prompt adjacent, every prompt with the
    same ``k``); estimators then compute group statistics on a ``[G, k]`` view with a handful of
    dense ops instead of scatter/gather.  Detecting it is one comparison against a cached pattern
    (building the pattern each call would cost more dispatches than the check saves).
    """
    b = ids.shape[0]
    if num_groups <= 0 or b % num_groups or b // num_groups < 2 or ids.dtype != torch.long:
        return 0
    k = b // num_groups
    return k if torch.equal(ids, _consecutive_ids(num_groups, k, ids.device)) else 0


def dense_group_stats(v: Tensor, with_std: bool = True) -> tuple[Tensor, Tensor | None]:
    """``(v - mean [G, k], unbiased std [G, 1] or None)`` of ``v`` [G, k] (one group per row,
    ``k >= 2``), two-pass like ``group_stats``."""
    k = v.shape[1]
    dev = v - v.sum(1, keepdim=True) / k
    if not with_std:
        return dev, None
    return dev, ((dev * dev).sum(1, keepdim=True) / (k - 1)).sqrt()
