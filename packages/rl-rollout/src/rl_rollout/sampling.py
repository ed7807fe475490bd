"""Pure sampling math shared by the HF engine and the tests.

Log-prob semantics (the `Engine` contract): the log-prob returned for a sampled token is taken from
the distribution it was drawn from: ``log_softmax(sampling_scores)``, after the repetition penalty,
the temperature and top-k / top-p (vLLM's ``processed_logprobs``; verl's and TRL's choice). The
trainer computes the log-probs of the same distribution (rl_train
``TrainingArgs.logprob_sampling``: temperature, then the same top-k / top-p set, renormalised), so
without a repetition penalty (which the trainer does not reproduce) ``rollout_log_probs`` and
``old_log_probs`` differ only numerically (kernels, batch shape, dtype). A greedy row (temperature
0) records ``log_softmax`` of its logits at temperature 1 (after a repetition penalty).
"""

from __future__ import annotations

import torch

__all__ = [
    "apply_repetition_penalty",
    "draw_tokens",
    "log_probs_of",
    "sample_tokens",
    "sampling_scores",
    "warp_logits",
]


def warp_logits(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """Sampling logits of one row after temperature, top-k and top-p (masked entries = -inf).

    logits: [V] float. temperature > 0. top_k = -1 disables it; top_p = 1.0 disables it.
    Top-k keeps every logit tied with the k-th. The top-p rule keeps the smallest prefix of the
    descending-sorted distribution whose mass reaches top_p (the highest-probability token is
    always kept; a stable sort, so among equal probabilities the lower token id comes first). The
    trainer reproduces this set with ``rl_algos.logprobs.truncation_keep_mask`` (a test pins the
    two together). Returns [V].
    """
    out = logits.float() / temperature
    vocab = out.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(out, top_k).values[-1]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, descending=True, stable=True)
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


def sampling_scores(
    logits: torch.Tensor, temperatures: list[float], top_ps: list[float], top_ks: list[int]
) -> torch.Tensor:
    """The logits each row samples from, ``[B, V]`` float: ``logits / temperature`` with top-k /
    top-p applied (:func:`warp_logits`; masked entries -inf); a greedy row (temperature 0) keeps
    its raw logits. ``softmax`` of a row is the distribution its token is drawn from."""
    vocab = logits.shape[-1]
    temps = torch.tensor([t if t > 0 else 1.0 for t in temperatures], device=logits.device)
    scores = logits.float() / temps.unsqueeze(-1)
    for row in range(logits.shape[0]):
        if temperatures[row] > 0 and (0 < top_ks[row] < vocab or top_ps[row] < 1.0):
            scores[row] = warp_logits(logits[row], temperatures[row], top_ps[row], top_ks[row])
    return scores


def draw_tokens(
    scores: torch.Tensor, temperatures: list[float], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """One token per row of :func:`sampling_scores` ``[B, V]`` -> ``[B]``. Gumbel-max: token =
    argmax(scores + Gumbel noise), an exact draw from softmax(scores); the noise of a row comes
    from that row's generator (reproducible per request), the rest is batched. A greedy row
    (temperature 0) takes the argmax."""
    batch, vocab = scores.shape
    device = scores.device
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
        tokens = torch.where(greedy, torch.argmax(scores, dim=-1), tokens)
    return tokens


def sample_tokens(
    logits: torch.Tensor,
    temperatures: list[float],
    top_ps: list[float],
    top_ks: list[int],
    generators: list[torch.Generator | None],
) -> torch.Tensor:
    """Draw one token per row. logits: [B, V]; per-row params (len B). Returns token ids [B]
    (:func:`draw_tokens` of :func:`sampling_scores`; temperature 0 is greedy)."""
    return draw_tokens(
        sampling_scores(logits, temperatures, top_ps, top_ks), temperatures, generators
    )


def log_probs_of(scores: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(scores)[token] per row: scores [B, V], tokens [B] -> [B] (float32)."""
    log_probs = torch.log_softmax(scores.float(), dim=-1)
    return log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
