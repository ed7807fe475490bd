"""Pure sampling math shared by the HF engine and the tests.

Log-prob semantics (CONTRACT.md): the log-prob returned for a sampled token is taken from the RAW
model distribution at temperature 1, ``log_softmax(logits)``, with no temperature, top-k or top-p
applied. That is exactly what a teacher-forced trainer forward computes, so the only difference
between ``rollout_log_probs`` and ``old_log_probs`` is numerical (kernels, batch shape, dtype).
Temperature/top-k/top-p only change WHICH token is drawn.
"""

from __future__ import annotations

import torch

__all__ = ["apply_repetition_penalty", "raw_log_probs_of", "sample_tokens", "warp_logits"]


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


def apply_repetition_penalty(logits: torch.Tensor, seen: list[int], penalty: float) -> torch.Tensor:
    """CTRL repetition penalty (Keskar et al. 2019; HF/vLLM semantics) on one row ``[V]``: the
    logits of ``seen`` token ids are divided by ``penalty`` where positive, multiplied where
    negative. ``penalty == 1`` returns ``logits`` unchanged; otherwise a new tensor ``[V]``."""
    if penalty == 1.0 or not seen:
        return logits
    out = logits.float().clone()
    ids = torch.tensor(sorted(set(seen)), dtype=torch.long, device=logits.device)
    picked = out[ids]
    out[ids] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return out


def sample_tokens(
    logits: torch.Tensor,
    temperatures: list[float],
    top_ps: list[float],
    top_ks: list[int],
    generators: list[torch.Generator | None],
) -> torch.Tensor:
    """Draw one token per row. logits: [B, V]; per-row params (len B). Returns token ids [B].

    Gumbel-max: token = argmax(warped_logits + Gumbel noise), an exact draw from
    softmax(warped_logits); the noise of a row comes from that row's generator (reproducible per
    request), the rest is batched. temperature == 0 is greedy (argmax of the raw logits).
    """
    batch, vocab = logits.shape
    device = logits.device
    temps = torch.tensor([t if t > 0 else 1.0 for t in temperatures], device=device)
    scores = logits.float() / temps.unsqueeze(-1)
    for row in range(batch):
        if temperatures[row] > 0 and (0 < top_ks[row] < vocab or top_ps[row] < 1.0):
            scores[row] = warp_logits(logits[row], temperatures[row], top_ps[row], top_ks[row])
    uniform = torch.empty((batch, vocab), device=device)
    for row in range(batch):
        gen = generators[row]
        if gen is not None and gen.device.type != device.type:
            uniform[row] = torch.rand(vocab, generator=gen).to(device)
        else:
            uniform[row] = torch.rand(vocab, generator=gen, device=device)
    tiny = torch.finfo(torch.float32).tiny
    gumbel = -torch.log(-torch.log(uniform.clamp(min=tiny, max=1.0 - 1e-7)))
    tokens = torch.argmax(scores + gumbel, dim=-1)
    greedy = torch.tensor([t == 0.0 for t in temperatures], device=device)
    if bool(greedy.any()):
        tokens = torch.where(greedy, torch.argmax(logits, dim=-1), tokens)
    return tokens


def raw_log_probs_of(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(token) under the raw temperature-1 distribution. logits [B, V], tokens [B] -> [B]."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
