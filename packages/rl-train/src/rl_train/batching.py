"""Splitting a rank's batch into mini-batches (optimizer steps) and micro-batches (forward/backward
passes), dynamic token-budget micro-batches, and padding removal (sequence packing).

Units: sizes are SAMPLES (rows of ``input_ids``) unless named ``*_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl_train.types import Batch


def batch_size(batch: Batch) -> int:
    """Rows ``B`` of ``input_ids [B, T]``."""
    if "input_ids" not in batch:
        raise KeyError("batch has no 'input_ids'")
    return int(batch["input_ids"].shape[0])


def seq_lens(batch: Batch) -> torch.Tensor:
    """Real tokens per row ``[B]`` (from ``attention_mask``; all of T if absent)."""
    ids = batch["input_ids"]
    if "attention_mask" not in batch:
        return torch.full((ids.shape[0],), ids.shape[1], dtype=torch.long)
    return batch["attention_mask"].to(torch.long).sum(-1)


def _is_rows(value: object, n: int) -> bool:
    """Whether a batch entry is per-row data: a tensor whose first dim is the batch's ``B``."""
    return isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == n


def select(batch: Batch, index: torch.Tensor | list[int]) -> Batch:
    """Rows ``index`` of every tensor whose first dim is ``B``; other entries are kept as they are."""
    n = batch_size(batch)
    idx = torch.as_tensor(index, dtype=torch.long)
    out: Batch = {}
    for key, value in batch.items():
        if _is_rows(value, n):
            out[key] = value.index_select(0, idx.to(value.device))
        else:
            out[key] = value
    return out


def concat(batches: list[Batch]) -> Batch:
    """The rows of ``batches`` one after another (the inverse of splitting with :func:`select`):
    every tensor whose first dim is its batch's ``B`` is concatenated; other entries are the
    first batch's."""
    if not batches:
        raise ValueError("concat needs at least one batch")
    n = batch_size(batches[0])
    out: Batch = dict(batches[0])
    for key, value in batches[0].items():
        if _is_rows(value, n):
            out[key] = torch.cat([b[key] for b in batches])
    return out


def split_mini_batches(
    batch: Batch, mini_batch_size: int, *, shuffle_generator: torch.Generator | None = None
) -> list[Batch]:
    """Consecutive chunks of ``mini_batch_size`` samples (the last may be smaller); rows are first
    permuted with ``shuffle_generator`` when given."""
    n = batch_size(batch)
    order = (
        torch.randperm(n, generator=shuffle_generator)
        if shuffle_generator is not None
        else torch.arange(n)
    )
    return [select(batch, order[i : i + mini_batch_size]) for i in range(0, n, mini_batch_size)]


def split_micro_batches(batch: Batch, micro_batch_size: int) -> list[Batch]:
    """Consecutive chunks of ``micro_batch_size`` samples."""
    n = batch_size(batch)
    return [
        select(batch, list(range(i, min(i + micro_batch_size, n))))
        for i in range(0, n, micro_batch_size)
    ]


def token_budget_groups(lengths: list[int], max_tokens: int, *, padded: bool) -> list[list[int]]:
    """Group row indices so each group's token cost fits ``max_tokens`` (first-fit decreasing).

    Cost of a group is ``sum(lengths)`` when sequences are packed (``padded=False``) and
    ``len(group) * max(lengths)`` when padded. A row longer than the budget gets a group of its own.
    Groups keep the original row order inside; groups are ordered by their first row.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    costs: list[tuple[int, int, int]] = []  # (count, max_len, total)
    for i in order:
        length = lengths[i]
        placed = False
        for g, (count, max_len, total) in enumerate(costs):
            new_cost = (count + 1) * max(max_len, length) if padded else total + length
            if new_cost <= max_tokens:
                groups[g].append(i)
                costs[g] = (count + 1, max(max_len, length), total + length)
                placed = True
                break
        if not placed:
            groups.append([i])
            costs.append((1, length, length))
    for group in groups:
        group.sort()
    groups.sort(key=lambda g: g[0])
    return groups


def dynamic_micro_batches(batch: Batch, max_tokens: int, *, packed: bool) -> list[Batch]:
    """Micro-batches of at most ``max_tokens`` tokens (real tokens when ``packed``, else padded)."""
    lengths = [int(x) for x in seq_lens(batch).tolist()]
    return [select(batch, g) for g in token_budget_groups(lengths, max_tokens, padded=not packed)]


def trim_padding(batch: Batch) -> Batch:
    """Drop trailing columns that are padding in every row (right-padded ``[B, T]`` tensors)."""
    ids = batch["input_ids"]
    t = ids.shape[1]
    keep = int(seq_lens(batch).max().item()) if ids.shape[0] else 0
    if keep >= t:
        return batch
    return {
        k: (v[:, :keep] if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[1] == t else v)
        for k, v in batch.items()
    }


@dataclass(frozen=True)
class PackedLayout:
    """Where each row's real tokens live in the packed ``[1, N]`` stream.

    Attributes:
        lengths: real tokens per row ``[B]``.
        cu_seqlens: cumulative lengths ``[B + 1]`` (int32, flash-attention varlen layout).
        num_cols: the padded length ``T`` of the unpacked batch.
    """

    lengths: torch.Tensor
    cu_seqlens: torch.Tensor
    num_cols: int

    @property
    def total_tokens(self) -> int:
        return int(self.cu_seqlens[-1].item())


def check_right_padded(attention_mask: torch.Tensor) -> None:
    """Raise naming the first row whose real tokens are not a prefix (packing needs right padding)."""
    mask = attention_mask.to(torch.bool)
    lengths = mask.sum(-1)
    expected = torch.arange(mask.shape[1], device=mask.device)[None, :] < lengths[:, None]
    bad = (mask != expected).any(-1).nonzero()
    if bad.numel():
        raise ValueError(f"attention_mask row {int(bad[0, 0])} is not right-padded")


def pack(
    input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, PackedLayout]:
    """Remove padding: ``input_ids [B, T]`` -> ``packed_ids [1, N]``, ``position_ids [1, N]`` that
    restart at 0 for every row (HF models derive the block-diagonal / varlen attention from them)."""
    check_right_padded(attention_mask)
    mask = attention_mask.to(torch.bool)
    lengths = mask.sum(-1).to(torch.long)
    packed_ids = input_ids[mask].unsqueeze(0)
    positions = torch.cat(
        [torch.arange(int(n), device=input_ids.device) for n in lengths.tolist()]
        or [torch.zeros(0, dtype=torch.long, device=input_ids.device)]
    )
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=input_ids.device)
    cu[1:] = torch.cumsum(lengths, 0)
    return packed_ids, positions.unsqueeze(0), PackedLayout(lengths, cu, int(input_ids.shape[1]))


def unpack(values: torch.Tensor, layout: PackedLayout, fill: float = 0.0) -> torch.Tensor:
    """Inverse of :func:`pack` for a per-token tensor: ``[1, N]`` (or ``[N]``) -> ``[B, T]``."""
    flat = values.reshape(-1)
    rows = layout.lengths.numel()
    out = flat.new_full((rows, layout.num_cols), fill)
    mask = (
        torch.arange(layout.num_cols, device=flat.device)[None, :]
        < layout.lengths.to(flat.device)[:, None]
    )
    out[mask] = flat
    return out


def padding_fraction(micro_batches: list[Batch], *, packed: bool) -> float:
    """Share of processed token slots that are padding (0 when packed)."""
    real = sum(int(seq_lens(mb).sum()) for mb in micro_batches)
    slots = real if packed else sum(int(mb["input_ids"].numel()) for mb in micro_batches)
    return 0.0 if slots == 0 else 1.0 - real / slots
