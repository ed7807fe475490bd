"""Token log-probabilities and entropies from logits or hidden states, memory-lean.

Formulas (per row, logits ``z`` over the vocabulary, ``lse = logsumexp(z)``):

- ``log p(y) = z_y - lse``
- ``H = lse - sum_v softmax(z)_v z_v = -sum_v p_v log p_v``
- ``dlog p(y)/dz = onehot(y) - p``;  ``dH/dz = -p * (log p + H)``

The naive functions upcast the whole ``[N, V]`` logits to float32.  The ``*_chunked`` functions and
``log_probs_from_hidden`` work ``chunk_size`` rows at a time inside a custom ``autograd.Function``
that saves only ``[N]`` statistics and recomputes each chunk in backward, so the float32 working
set is ``O(chunk_size * V)`` in forward and backward (the gradient of the input itself is as large
as the input, as always).  Labels ``< 0`` are ignored: their log-prob and entropy are 0 and they get
no gradient.

Sampling truncation (``top_k`` / ``top_p``, the distribution a sampler with those settings draws
from): after the temperature, :func:`truncation_keep_mask` keeps the top-k logits (every logit tied
with the k-th stays), then the smallest prefix of the top-k distribution sorted descending (a stable
sort: among equal probabilities the lower token id comes first) whose mass reaches ``top_p`` (the
most probable token always stays), exactly as rl-rollout's sampler and vLLM do. The log-probs and
entropy are those of the renormalised distribution over the kept set, ``log_softmax`` with the rest
at ``-inf``; the gradient flows through the kept logits (the set itself is a constant). The label
of each row always joins the kept set: a token sampled by a slightly different (stale) policy may
fall outside the current policy's set, and its log-prob must stay finite (renormalised over the set
plus that token) rather than ``-inf``. A truncated chunk also holds the sort's values and indices,
so the auto-sized chunks are smaller (same memory).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "aligned_log_probs",
    "entropy_from_logits",
    "entropy_from_logits_chunked",
    "log_probs_from_hidden",
    "log_probs_from_logits",
    "log_probs_from_logits_chunked",
    "sum_pi_squared_from_logits",
    "truncation_keep_mask",
]

# float32 bytes per [chunk, V] working buffer when auto-sizing: small on the host, larger on an
# accelerator so each chunk's matmul is big enough to run near peak (1 GiB = 1,766 rows at 152k)
_CHUNK_BYTES = 128 * 1024 * 1024
_CHUNK_BYTES_ACCELERATOR = 1024 * 1024 * 1024
# bytes per vocabulary entry of a truncated chunk's working set besides the float32 row: the top-k
# masked copy (4), the sort's values (4) and int64 indices (8), the sorted probabilities and their
# cumulative sum (8), bool masks (4)
_TRUNCATION_BYTES_PER_ENTRY = 28


def _auto_chunk(
    vocab: int,
    chunk_size: int | None,
    device: torch.device | None = None,
    truncated: bool = False,
) -> int:
    if chunk_size is not None:
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
        return chunk_size
    budget = _CHUNK_BYTES if device is None or device.type == "cpu" else _CHUNK_BYTES_ACCELERATOR
    per_entry = 4 + (_TRUNCATION_BYTES_PER_ENTRY if truncated else 0)
    return max(1, budget // (per_entry * max(vocab, 1)))


def _truncates(vocab: int, top_k: int | None, top_p: float | None) -> bool:
    """Whether ``top_k`` / ``top_p`` remove anything from a ``vocab``-sized distribution (None,
    ``top_k <= 0`` or ``>= vocab`` and ``top_p >= 1`` are off, as in the samplers)."""
    return (top_k is not None and 0 < top_k < vocab) or (top_p is not None and top_p < 1.0)


def _check_truncation(top_k: int | None, top_p: float | None) -> None:
    if top_p is not None and not top_p > 0.0:
        raise ValueError(f"top_p must be > 0 (1 or None = off), got {top_p}")
    if top_k is not None and isinstance(top_k, bool):
        raise ValueError(f"top_k must be an integer or None, got {top_k!r}")


def truncation_keep_mask(
    scores: Tensor, top_k: int | None, top_p: float | None, keep: Tensor | None = None
) -> Tensor:
    """The tokens a top-k / top-p sampler keeps, ``[..., V]`` bool (see the module docstring).

    Args:
        scores: ``[..., V]`` float logits already divided by the temperature.
        top_k: keep the ``top_k`` largest (ties with the k-th kept); None, ``<= 0`` or ``>= V``:
            off.
        top_p: then keep the smallest descending-sorted prefix (stable sort) of the top-k
            distribution whose mass reaches ``top_p``; the first token always stays. None or
            ``>= 1``: off.
        keep: ``[...]`` int64 token ids that stay in the set whatever the rules say (the labels).
    Returns:
        ``[..., V]`` bool, True = kept.
    """
    _check_truncation(top_k, top_p)
    vocab = scores.shape[-1]
    kept = torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
    z = scores
    if top_k is not None and 0 < top_k < vocab:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        kept = z >= kth
        z = z.masked_fill(~kept, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=True, stable=True)
        probs = torch.softmax(sorted_z, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1).sub_(probs)
        del sorted_z, probs
        kept_sorted = mass_before < top_p
        kept_sorted[..., 0] = True
        kept &= torch.zeros_like(kept_sorted).scatter_(-1, order, kept_sorted)
    if keep is not None:
        kept.scatter_(-1, keep.unsqueeze(-1), True)
    return kept


def _truncate_(z: Tensor, labels: Tensor, top_k: int | None, top_p: float | None) -> Tensor:
    """Mask (in place, ``-inf``) the entries of the float32 chunk ``z [C, V]`` a top-k / top-p
    sampler drops; each row's label (``< 0``: token 0) stays. Returns ``z``."""
    kept = truncation_keep_mask(z, top_k, top_p, keep=labels.clamp(min=0))
    return z.masked_fill_(~kept, float("-inf"))


def _zero_dropped_(logp: Tensor) -> Tensor:
    """``log p`` with the ``-inf`` of truncated entries replaced by 0 (in place), so that
    ``p * log p`` and its gradient are 0 there instead of NaN."""
    return logp.masked_fill_(torch.isneginf(logp), 0.0)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least float32 (float64 inputs stay float64)."""
    return torch.promote_types(dtype, torch.float32)


def log_probs_from_logits(
    logits: Tensor,
    labels: Tensor,
    temperature: float = 1.0,
    *,
    top_k: int | None = None,
    top_p: float | None = None,
) -> Tensor:
    """Naive ``log_softmax(logits / temperature)[labels]`` in float32, over the ``top_k`` /
    ``top_p`` kept set (each label kept; see the module docstring) where those are set.

    Args:
        logits: ``[..., V]`` (any float dtype).
        labels: ``[...]`` int64 token ids (``< 0`` ignored → 0).
    Returns:
        ``[...]`` float32.
    """
    z = logits.to(_compute_dtype(logits.dtype))
    if temperature != 1.0:
        z = z / temperature
    if _truncates(z.shape[-1], top_k, top_p):
        kept = truncation_keep_mask(z, top_k, top_p, keep=labels.clamp(min=0))
        z = z.masked_fill(~kept, float("-inf"))
    valid = labels >= 0
    lp = torch.log_softmax(z, dim=-1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.where(valid, lp, torch.zeros_like(lp))


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Naive entropy ``H = logsumexp(z) - sum softmax(z) * z`` of ``softmax(logits / temperature)``.

    Args:
        logits: ``[..., V]``.
    Returns:
        ``[...]`` float32.
    """
    z = logits.to(_compute_dtype(logits.dtype))
    if temperature != 1.0:
        z = z / temperature
    p = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (p * z).sum(-1)


def _chunk_stats(
    z: Tensor, labels: Tensor, need_entropy: bool, truncated: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """Return (log_prob [C], lse [C], entropy [C] or empty) for one float32 chunk ``z`` [C, V]
    (``truncated``: dropped entries are ``-inf``)."""
    lse = torch.logsumexp(z, dim=-1)
    lp = z.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) - lse
    if need_entropy:
        z.sub_(lse.unsqueeze(-1))  # z now holds log p (z is a private buffer)
        p = z.exp()
        if truncated:
            _zero_dropped_(z)
        ent = -(p * z).sum(-1)
    else:
        ent = lse.new_empty(0)
    return lp, lse, ent


def _chunk_grad(
    z: Tensor,
    labels: Tensor,
    lse: Tensor,
    ent: Tensor | None,
    grad_lp: Tensor | None,
    grad_ent: Tensor | None,
    truncated: bool = False,
) -> Tensor:
    """Gradient w.r.t. the (temperature-scaled) float32 chunk ``z`` [C, V]; ``z`` is overwritten
    (``truncated``: dropped entries are ``-inf``; their gradient is 0)."""
    z.sub_(lse.unsqueeze(-1))  # log p
    logp = z
    p = logp.exp()
    if truncated:
        _zero_dropped_(logp)
    if grad_ent is not None and ent is not None:
        # dH/dz = -p (log p + H); combine with -p * g_lp in one buffer.
        logp.add_(ent.unsqueeze(-1)).mul_(grad_ent.unsqueeze(-1))
        if grad_lp is not None:
            logp.add_(grad_lp.unsqueeze(-1))
        grad = p.mul_(logp).neg_()
    else:
        assert grad_lp is not None
        grad = p.mul_(grad_lp.unsqueeze(-1)).neg_()
    if grad_lp is not None:
        grad.scatter_add_(-1, labels.clamp(min=0).unsqueeze(-1), grad_lp.unsqueeze(-1))
    return grad


def _scaled_chunk(rows: Tensor, dtype: torch.dtype, temperature: float) -> Tensor:
    """A private ``dtype`` copy of the logits ``rows [C, V]`` divided by ``temperature`` (the
    caller modifies it in place)."""
    z = rows.to(dtype, copy=True)
    if temperature != 1.0:
        z.div_(temperature)
    return z


class _ChunkedFromLogits(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        logits: Tensor,
        labels: Tensor,
        chunk_size: int,
        temperature: float,
        need_entropy: bool,
        top_k: int | None = None,
        top_p: float | None = None,
    ) -> tuple[Tensor, Tensor]:
        n = logits.shape[0]
        valid = labels >= 0
        cdt = _compute_dtype(logits.dtype)
        lp = torch.empty(n, dtype=cdt, device=logits.device)
        lse = torch.empty_like(lp)
        ent = torch.empty_like(lp) if need_entropy else lp.new_empty(0)
        truncated = _truncates(logits.shape[-1], top_k, top_p)
        for start in range(0, n, chunk_size):
            sl = slice(start, min(start + chunk_size, n))
            z = _scaled_chunk(logits[sl], lse.dtype, temperature)
            if truncated:
                _truncate_(z, labels[sl], top_k, top_p)
            c_lp, c_lse, c_ent = _chunk_stats(z, labels[sl], need_entropy, truncated)
            lp[sl], lse[sl] = c_lp, c_lse
            if need_entropy:
                ent[sl] = c_ent
        lp = torch.where(valid, lp, torch.zeros_like(lp))
        if need_entropy:
            ent = torch.where(valid, ent, torch.zeros_like(ent))
        ctx.save_for_backward(logits, labels, lse, ent)
        ctx.chunk_size, ctx.temperature, ctx.need_entropy = chunk_size, temperature, need_entropy
        ctx.top_k, ctx.top_p, ctx.truncated = top_k, top_p, truncated
        return lp, ent

    @staticmethod
    def backward(ctx: Any, grad_lp: Tensor | None, grad_ent: Tensor | None):  # type: ignore[override]
        logits, labels, lse, ent = ctx.saved_tensors
        valid = (labels >= 0).to(lse.dtype)
        g_lp = None if grad_lp is None else grad_lp.to(lse.dtype) * valid
        g_ent = (
            None if (grad_ent is None or not ctx.need_entropy) else grad_ent.to(lse.dtype) * valid
        )
        if g_lp is None and g_ent is None:
            return None, None, None, None, None, None, None
        grad_logits = torch.empty_like(logits)
        n = logits.shape[0]
        for start in range(0, n, ctx.chunk_size):
            sl = slice(start, min(start + ctx.chunk_size, n))
            z = _scaled_chunk(logits[sl], lse.dtype, ctx.temperature)
            if ctx.truncated:  # the same set as in forward: the same float32 values, same rule
                _truncate_(z, labels[sl], ctx.top_k, ctx.top_p)
            g = _chunk_grad(
                z,
                labels[sl],
                lse[sl],
                ent[sl] if g_ent is not None else None,
                None if g_lp is None else g_lp[sl],
                None if g_ent is None else g_ent[sl],
                ctx.truncated,
            )
            if ctx.temperature != 1.0:
                g.div_(ctx.temperature)
            grad_logits[sl] = g
        return grad_logits, None, None, None, None, None, None


def _flatten(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, torch.Size]:
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree: "
            "expected logits [..., V] and labels [...]"
        )
    return logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), labels.shape


def log_probs_from_logits_chunked(
    logits: Tensor,
    labels: Tensor,
    *,
    chunk_size: int | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    top_k: int | None = None,
    top_p: float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Chunked ``log_softmax(logits / temperature)[labels]`` (and entropy) never holding float32
    ``[N, V]``; with ``top_k`` / ``top_p`` those of the truncated distribution (module docstring).

    Gradients flow to ``logits`` through a custom backward that recomputes each chunk.

    Args:
        logits: ``[..., V]`` (bf16/fp16/fp32); labels: ``[...]`` int64 (``< 0`` ignored).
        chunk_size: rows per chunk (default: as many as fit 128 MiB of float32 working set).
        with_entropy: also return the entropy.
    Returns:
        ``(log_probs [...], entropy [...] or None)``, float32.
    """
    _check_truncation(top_k, top_p)
    flat_logits, flat_labels, shape = _flatten(logits, labels)
    vocab = flat_logits.shape[-1]
    chunk = _auto_chunk(vocab, chunk_size, truncated=_truncates(vocab, top_k, top_p))
    lp, ent = _ChunkedFromLogits.apply(
        flat_logits, flat_labels, chunk, temperature, with_entropy, top_k, top_p
    )
    return lp.reshape(shape), (ent.reshape(shape) if with_entropy else None)


@torch.no_grad()
def sum_pi_squared_from_logits(
    logits: Tensor, *, chunk_size: int | None = None, temperature: float = 1.0
) -> Tensor:
    """``sum_v pi(v)^2`` of ``pi = softmax(logits / temperature)`` per position, chunked (never
    float32 ``[N, V]``): ``exp(logsumexp(2 z) - 2 logsumexp(z))``. No gradient (a statistic of
    the policy that sampled, for rl_algos.advantages.optimal_token_baseline). Example: logits
    ``[0, ln 3]`` give ``pi = [1/4, 3/4]`` and ``1/16 + 9/16 = 0.625``.

    Args:
        logits: ``[..., V]``.
    Returns:
        ``[...]`` float32, in ``[1/V, 1]``.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    chunk = _auto_chunk(flat.shape[-1], chunk_size, flat.device)
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
    for start in range(0, flat.shape[0], chunk):
        z = flat[start : start + chunk].to(_compute_dtype(flat.dtype))
        if temperature != 1.0:
            z = z / temperature
        out[start : start + chunk] = (
            torch.logsumexp(2.0 * z, dim=-1) - 2.0 * torch.logsumexp(z, dim=-1)
        ).exp()
    return out.reshape(logits.shape[:-1])


def entropy_from_logits_chunked(
    logits: Tensor, *, chunk_size: int | None = None, temperature: float = 1.0
) -> Tensor:
    """Chunked entropy of ``softmax(logits / temperature)``; gradient via chunked recompute.

    Args:
        logits: ``[..., V]``.
    Returns:
        ``[...]`` float32.
    """
    labels = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    flat_logits, flat_labels, shape = _flatten(logits, labels)
    chunk = _auto_chunk(flat_logits.shape[-1], chunk_size)
    _, ent = _ChunkedFromLogits.apply(
        flat_logits, flat_labels, chunk, temperature, True, None, None
    )
    return ent.reshape(shape)


def _hidden_chunk_forward(
    h: Tensor,
    weight: Tensor,
    labels: Tensor,
    temperature: float,
    need_entropy: bool,
    top_k: int | None = None,
    top_p: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(log_prob, lse, entropy) of one chunk of hidden rows ``h`` [C, H] under ``weight`` [V, H]
    (truncated by ``top_k`` / ``top_p`` where they are set)."""
    z = (h @ weight.t()).to(_compute_dtype(h.dtype))
    if temperature != 1.0:
        z = z / temperature
    truncated = _truncates(z.shape[-1], top_k, top_p)
    if truncated:
        _truncate_(z, labels, top_k, top_p)
    return _chunk_stats(z, labels, need_entropy, truncated)


def _hidden_chunk_backward(
    h: Tensor,
    weight: Tensor,
    labels: Tensor,
    lse: Tensor,
    ent: Tensor | None,
    g_lp: Tensor | None,
    g_ent: Tensor | None,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Gradients of one chunk: (w.r.t. ``h`` [C, H], w.r.t. ``weight`` [V, H]), in the weight's
    dtype (bf16 weights: tensor-core matmuls, as an unfused lm_head's backward)."""
    z = (h @ weight.t()).to(lse.dtype)
    if temperature != 1.0:
        z = z / temperature
    truncated = _truncates(z.shape[-1], top_k, top_p)
    if truncated:  # the same set as in forward: the same float32 values, same rule
        _truncate_(z, labels, top_k, top_p)
    g = _chunk_grad(z, labels, lse, ent, g_lp, g_ent, truncated)
    if temperature != 1.0:
        g = g / temperature
    g = g.to(weight.dtype)
    return g @ weight, g.t() @ h.to(weight.dtype)


_KERNELS: dict[str, tuple[Any, Any]] = {}


def _chunk_kernels(device: torch.device, truncated: bool = False) -> tuple[Any, Any]:
    """The per-chunk forward/backward: compiled on CUDA (the matmul's epilogue, log-sum-exp and
    softmax gradient fused into few passes over ``[C, V]``), eager elsewhere and for a truncated
    distribution (its sort dominates; eager keeps the kept set bit-identical between forward and
    backward). ``RL_ALGOS_COMPILE=0`` forces eager."""
    use_compile = (
        device.type == "cuda" and not truncated and os.environ.get("RL_ALGOS_COMPILE", "1") != "0"
    )
    key = "compiled" if use_compile else "eager"
    if key not in _KERNELS:
        if use_compile:
            _KERNELS[key] = (
                torch.compile(_hidden_chunk_forward, dynamic=True),
                torch.compile(_hidden_chunk_backward, dynamic=True),
            )
        else:
            _KERNELS[key] = (_hidden_chunk_forward, _hidden_chunk_backward)
    return _KERNELS[key]


class _ChunkedFromHidden(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        labels: Tensor,
        chunk_size: int,
        temperature: float,
        need_entropy: bool,
        top_k: int | None,
        top_p: float | None,
    ) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        valid = labels >= 0
        cdt = _compute_dtype(hidden.dtype)
        lp = torch.empty(n, dtype=cdt, device=hidden.device)
        lse = torch.empty_like(lp)
        ent = torch.empty_like(lp) if need_entropy else lp.new_empty(0)
        truncated = _truncates(weight.shape[0], top_k, top_p)
        chunk_forward, _ = _chunk_kernels(hidden.device, truncated)
        for start in range(0, n, chunk_size):
            sl = slice(start, min(start + chunk_size, n))
            c_lp, c_lse, c_ent = chunk_forward(
                hidden[sl], weight, labels[sl], temperature, need_entropy, top_k, top_p
            )
            lp[sl], lse[sl] = c_lp, c_lse
            if need_entropy:
                ent[sl] = c_ent
        lp = torch.where(valid, lp, torch.zeros_like(lp))
        if need_entropy:
            ent = torch.where(valid, ent, torch.zeros_like(ent))
        ctx.save_for_backward(hidden, weight, labels, lse, ent)
        ctx.chunk_size, ctx.temperature, ctx.need_entropy = chunk_size, temperature, need_entropy
        ctx.top_k, ctx.top_p, ctx.truncated = top_k, top_p, truncated
        return lp, ent

    @staticmethod
    def backward(ctx: Any, grad_lp: Tensor | None, grad_ent: Tensor | None):  # type: ignore[override]
        hidden, weight, labels, lse, ent = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        valid = (labels >= 0).to(lse.dtype)
        g_lp = None if grad_lp is None else grad_lp.to(lse.dtype) * valid
        g_ent = (
            None if (grad_ent is None or not ctx.need_entropy) else grad_ent.to(lse.dtype) * valid
        )
        if (g_lp is None and g_ent is None) or not (need_h or need_w):
            return None, None, None, None, None, None, None, None
        grad_h = torch.empty_like(hidden) if need_h else None
        # Accumulate the weight gradient in >= float32 across chunks (one matmul would too).
        grad_w = (
            torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device) if need_w else None
        )
        _, chunk_backward = _chunk_kernels(hidden.device, ctx.truncated)
        n = hidden.shape[0]
        for start in range(0, n, ctx.chunk_size):
            sl = slice(start, min(start + ctx.chunk_size, n))
            c_grad_h, c_grad_w = chunk_backward(
                hidden[sl],
                weight,
                labels[sl],
                lse[sl],
                ent[sl] if g_ent is not None else None,
                None if g_lp is None else g_lp[sl],
                None if g_ent is None else g_ent[sl],
                ctx.temperature,
                ctx.top_k,
                ctx.top_p,
            )
            if grad_h is not None:
                grad_h[sl] = c_grad_h
            if grad_w is not None:
                grad_w.add_(c_grad_w)
        gw = None if grad_w is None else grad_w.to(weight.dtype)
        return grad_h, gw, None, None, None, None, None, None


def log_probs_from_hidden(
    hidden: Tensor,
    lm_head_weight: Tensor,
    labels: Tensor,
    chunk_size: int | None = None,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    top_k: int | None = None,
    top_p: float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropy) of ``labels`` under ``softmax(hidden @ W^T / temperature)``,
    truncated by ``top_k`` / ``top_p`` where set (module docstring).

    The logits ``[N, V]`` are never materialised: forward and backward compute ``chunk_size``
    rows at a time; gradients flow to ``hidden`` and ``lm_head_weight`` (weight gradient
    accumulated in float32).

    Args:
        hidden: ``[..., H]`` last hidden states (after the final norm).
        lm_head_weight: ``[V, H]``.
        labels: ``[...]`` int64 (``< 0`` ignored).
    Returns:
        ``(log_probs [...], entropy [...] or None)``, float32.
    """
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} and labels {tuple(labels.shape)} disagree: "
            "expected hidden [..., H] and labels [...]"
        )
    if lm_head_weight.dim() != 2 or lm_head_weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"lm_head_weight must be [V, H={hidden.shape[-1]}], got {tuple(lm_head_weight.shape)}"
        )
    _check_truncation(top_k, top_p)
    shape = labels.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    vocab = lm_head_weight.shape[0]
    truncated = _truncates(vocab, top_k, top_p)
    chunk = _auto_chunk(vocab, chunk_size, hidden.device, truncated)
    lp, ent = _ChunkedFromHidden.apply(
        flat_h, lm_head_weight, labels.reshape(-1), chunk, temperature, with_entropy, top_k, top_p
    )
    return lp.reshape(shape), (ent.reshape(shape) if with_entropy else None)


def aligned_log_probs(
    logits: Tensor,
    input_ids: Tensor,
    *,
    with_entropy: bool = False,
    chunk_size: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs aligned with ``input_ids`` per CONTRACT: ``out[b, t] = log p(ids[b,t] | ids[b,:t])``
    (of the ``top_k`` / ``top_p``-truncated distribution where set).

    Column 0 is 0 (no prediction for the first token).  Uses the chunked path without copying the
    logits (the last position is fed an ignored label instead of slicing).

    Args:
        logits: ``[B, T, V]`` causal-LM logits (``logits[:, t]`` predicts token ``t + 1``).
        input_ids: ``[B, T]``.
    Returns:
        ``(log_probs [B, T], entropy [B, T] or None)`` float32; entropy at ``t`` is that of the
        distribution that produced token ``t``.
    """
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise ValueError(
            f"expected logits [B, T, V] and input_ids [B, T], got {tuple(logits.shape)} and "
            f"{tuple(input_ids.shape)}"
        )
    next_ids = torch.full_like(input_ids, -1)
    next_ids[:, :-1] = input_ids[:, 1:]
    lp, ent = log_probs_from_logits_chunked(
        logits,
        next_ids,
        chunk_size=chunk_size,
        temperature=temperature,
        with_entropy=with_entropy,
        top_k=top_k,
        top_p=top_p,
    )
    zero = lp.new_zeros(lp.shape[0], 1)
    lp = torch.cat([zero, lp[:, :-1]], dim=1)
    if ent is not None:
        ent = torch.cat([zero, ent[:, :-1]], dim=1)
    return lp, ent
