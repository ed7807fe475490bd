"""The SFT recipe's held-out loss (its batches: rl_runtime.step.epochs).

Held-out metrics (`val/*`): `loss`, the mean negative log-likelihood per trained token over
every held-out row (the token-mean the training loss is), and `perplexity` = exp(loss); also
`tokens`, the trained tokens they are averaged over."""

from __future__ import annotations

import math
from typing import Any

import torch

from rl_runtime.step.sft_data import SFTExample, collate

CHUNK = 64
"""Held-out rows per forward."""


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
