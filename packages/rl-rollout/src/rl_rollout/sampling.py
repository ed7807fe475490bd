"""Pure sampling math shared by the HF engine and the tests.

Log-prob semantics (CONTRACT.md): the log-prob returned for a sampled token is taken from the RAW
model distribution at temperature 1, ``log_softmax(logits)``, with no temperature, top-k or top-p
applied. That is exactly what a teacher-forced trainer forward computes, so the only difference
between ``rollout_log_probs`` and ``old_log_probs`` is numerical (kernels, batch shape, dtype).
Temperature/top-k/top-p only change WHICH token is drawn.
"""

from __future__ import annotations

import torch

__all__ = ["raw_log_probs_of", "sample_tokens", "warp_logits"]


def warp_logits(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """Sampling logits of one row after temperature, top-k and top-p (masked entries = -inf).

    logits: [V] float. temperature > 0. top_k = -1 disables it; top_p = 1.0 disables it.
    The top-p rule keeps the smallest prefix of the descending-sorted distribution whose mass
    reaches top_p (the highest-probability token is always kept). Returns [V].
    """
    out = logits.float() / temperature
    vocab = out.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(out, top_k).values[-1]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def sample_tokens(
    logits: torch.Tensor,
    temperatures: list[float],
    top_ps: list[float],
    top_ks: list[int],
    generators: list[torch.Generator | None],
) -> torch.Tensor:
    """Draw one token per row. logits: [B, V]; per-row params (len B). Returns token ids [B].

    temperature == 0 is greedy (argmax of the raw logits). A row's generator makes it reproducible.
    """
    tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    for row in range(logits.shape[0]):
        if temperatures[row] == 0.0:
            tokens[row] = torch.argmax(logits[row])
            continue
        warped = warp_logits(logits[row], temperatures[row], top_ps[row], top_ks[row])
        probs = torch.softmax(warped, dim=-1)
        gen = generators[row]
        if gen is not None and gen.device != probs.device:
            # A CPU generator drives the draw on any device: sample on CPU from the same probs.
            tokens[row] = torch.multinomial(probs.cpu(), 1, generator=gen)[0].to(logits.device)
        else:
            tokens[row] = torch.multinomial(probs, 1, generator=gen)[0]
    return tokens


def raw_log_probs_of(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(token) under the raw temperature-1 distribution. logits [B, V], tokens [B] -> [B]."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
