"""The SFT recipe's parts: the seeded epoch order of batches and the held-out loss.

Held-out metrics (`val/*`): `loss`, the mean negative log-likelihood per trained token over
every held-out row (the token-mean the training loss is), and `perplexity` = exp(loss); also
`tokens`, the trained tokens they are averaged over."""

from __future__ import annotations

import math
from typing import Any

import torch

from rl_runtime.state.seeds import epoch_order_seed
from rl_runtime.step.sft_data import SFTExample, collate

CHUNK = 64
"""Held-out rows per forward."""


def batch_position(num_examples: int, per_step: int, step: int) -> tuple[int, int]:
    """`(epoch, batch within the epoch)` of pipeline step `step` (0-based): an epoch is
    `num_examples // per_step` whole batches (its partial last batch is skipped, as ROLL's
    drop_last)."""
    return divmod(step, num_examples // per_step)


def batch_index(num_examples: int, per_step: int, seed: int, step: int) -> list[int]:
    """Rows of pipeline step `step`: seeded epoch permutations consumed in order, `per_step` at
    a time; a function of the step alone, so a resumed run continues at the next batch."""
    epoch, k = batch_position(num_examples, per_step, step)
    gen = torch.Generator().manual_seed(epoch_order_seed(seed, epoch))
    return torch.randperm(num_examples, generator=gen)[k * per_step : (k + 1) * per_step].tolist()


def held_out_loss(
    ctx: Any, examples: list[SFTExample], pad_token_id: int, role: str = "actor_train"
) -> dict[str, float]:
    """`val/loss` (token-mean NLL of the trained tokens), `val/perplexity`, `val/tokens` of
    `role`'s policy on `examples`, forward only, `CHUNK` rows at a time."""
    total, tokens = 0.0, 0
    for i in range(0, len(examples), CHUNK):
        t = collate(examples[i : i + CHUNK], pad_token_id)
        lp = ctx.forward(role, t)["log_probs"].to(torch.float64)
        mask = t["response_mask"]
        total += float(-(lp * mask).sum())
        tokens += int(mask.sum())
    loss = total / max(tokens, 1)
    return {"val/loss": loss, "val/perplexity": math.exp(min(loss, 700.0)), "val/tokens": tokens}
