"""The rows of a supervised or preference step: seeded epoch permutations of a fixed dataset,
consumed `per_step` at a time, as a function of the step alone (a resumed run continues at the
next batch). Shared by the SFT, DPO and off-policy distillation pipelines."""

from __future__ import annotations

import torch

from rl_runtime.state.seeds import epoch_order_seed


def batch_position(num_examples: int, per_step: int, step: int) -> tuple[int, int]:
    """`(epoch, batch within the epoch)` of pipeline step `step` (0-based): an epoch is
    `num_examples // per_step` whole batches (its partial last batch is skipped)."""
    return divmod(step, num_examples // per_step)


def batch_index(num_examples: int, per_step: int, seed: int, step: int) -> list[int]:
    """Examples of pipeline step `step`: seeded epoch permutations consumed in order, `per_step`
    at a time (the last partial batch of an epoch is skipped); a function of the step alone, so
    a resumed run continues at the next batch."""
    epoch, k = batch_position(num_examples, per_step, step)
    gen = torch.Generator().manual_seed(epoch_order_seed(seed, epoch))
    return torch.randperm(num_examples, generator=gen)[k * per_step : (k + 1) * per_step].tolist()
