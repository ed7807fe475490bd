"""Sequence packing of supervised examples: several examples in one row, kept apart.

`packed_batch` concatenates examples into one `[1, N]` stream whose `position_ids` restart at 0
for every example (HF models derive the block-diagonal causal attention from them: sdpa/eager
build a block mask, varlen kernels take `cu_seqlens`), so no token attends across an example
boundary and the first token of each example is predicted from nothing (its loss flag is False,
as in `rl_runtime.step.sft_data.collate`). `pack_examples` groups examples into packs under a token capacity
(first-fit decreasing). The training backends pack the same way themselves
(`use_sequence_packing`: rl_train.batching.pack removes a micro-batch's padding), so a recipe
hands them padded rows (`rl_runtime.step.sft_data.collate`) and this module is for callers that run a model on a
packed stream directly (a teacher forward in distillation, the packing-equals-padding test).
"""

from __future__ import annotations

import torch

from rl_runtime.step.sft_data import SFTExample


def packed_batch(examples: list[SFTExample]) -> dict[str, torch.Tensor]:
    """`input_ids [1, N]`, `position_ids [1, N]` (restarting per example), `response_mask
    [1, N]` (bool), `cu_seqlens [E + 1]` (int32 example boundaries) and `lengths [E]`, N the
    total token count of the E `examples`. Forward it with `position_ids`, no attention mask and
    `use_cache=False` (transformers derives the block mask from the positions only without a
    cache), plus `cu_seqlens` for varlen kernels (rl_train.attention.packed_attention_kwargs)."""
    if not examples:
        raise ValueError("packed_batch: no examples")
    lengths = torch.tensor([len(e.token_ids) for e in examples], dtype=torch.long)
    ids = torch.tensor([t for e in examples for t in e.token_ids], dtype=torch.long)
    mask = torch.tensor([m for e in examples for m in e.loss_mask], dtype=torch.bool)
    positions = torch.cat([torch.arange(int(n)) for n in lengths])
    starts = torch.cumsum(lengths, 0) - lengths
    mask[starts] = False  # nothing predicts an example's first token
    cu = torch.zeros(len(examples) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    return {
        "input_ids": ids[None],
        "position_ids": positions[None],
        "response_mask": mask[None],
        "cu_seqlens": cu,
        "lengths": lengths,
    }


def pack_examples(examples: list[SFTExample], capacity: int) -> list[list[int]]:
    """Indices of `examples` grouped into packs of at most `capacity` tokens (first-fit
    decreasing; an example longer than `capacity` is a pack of its own). Every index appears
    exactly once; packs are in order of their first (longest) example."""
    if capacity < 1:
        raise ValueError(f"capacity={capacity}: must be >= 1")
    order = sorted(range(len(examples)), key=lambda i: -len(examples[i].token_ids))
    packs: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = len(examples[i].token_ids)
        for k, free in enumerate(room):
            if n <= free:
                packs[k].append(i)
                room[k] -= n
                break
        else:
            packs.append([i])
            room.append(max(capacity - n, 0))
    return packs


def unpack(values: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
    """Per-example slices `[n_e, ...]` of a packed `[1, N, ...]` (or `[N, ...]`) tensor."""
    flat = values[0] if values.dim() > 1 and values.shape[0] == 1 else values
    return list(torch.split(flat, lengths.tolist()))
