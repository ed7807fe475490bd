"""Advantage estimators.  All return ``(advantages [B, T], returns [B, T])`` zeroed outside
``response_mask``.

Token-level: ``gae`` (critic) and the discounted-return estimators.  Outcome estimators take
``scores`` — one outcome reward per row ``[B]``, or token-level rewards ``[B, T]`` that are summed
over the response — and ``index``, the group (prompt) of each row as a ``[B]`` int tensor or any
sequence of hashables.  Group statistics are vectorised, no Python loop over groups or rows (a list
of hashable keys is mapped to ids once): when the rows come as rollouts emit them (the ``k >= 2``
samples of each prompt adjacent, equal ``k``) they run on a ``[G, k]`` view with a few dense ops;
otherwise with ``bincount``/``index_add``/``index_select``.  Both paths give the same advantages
(up to float rounding).  The ``[B, T]`` output is written in one ``torch.where`` pass; response
lengths (``opo``, ``reinforce_pp_baseline``) come from one cheap pass over the mask's bytes.  For
outcome estimators ``returns`` is the *same tensor* as ``advantages`` (as in verl); do not modify
one in place.

Multi-turn rows: tokens outside ``response_mask`` (env/tool tokens, prompt, padding) are skipped by
the token-level recursions, i.e. the masked tokens of a row are treated as one contiguous episode.

Registry: ``get_estimator(name)``, ``register_estimator(name)`` (duplicate name = error),
``list_estimators()``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from functools import partial
from typing import Any, TypeVar

import torch
from torch import Tensor

from rl_algos._groups import (
    GroupIndex,
    consecutive_group_size,
    dense_group_stats,
    group_count_mean,
    group_ids,
    group_stats,
    group_sum,
)
from rl_algos._scan import compact, compaction, discounted_reverse_cumsum, masked_discounted_returns
from rl_algos.aggregate import masked_whiten
from rl_algos.rewards import normalize_rewards

__all__ = [
    "dr_grpo",
    "gae",
    "get_estimator",
    "gigpo",
    "gpg",
    "grpo",
    "grpo_passk",
    "list_estimators",
    "opo",
    "optimal_token_baseline",
    "register_estimator",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "reinforce_returns",
    "remax",
    "rloo",
    "step_reinforce",
]

F = TypeVar("F", bound=Callable[..., Any])
_ESTIMATORS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {}


def register_estimator(name: str) -> Callable[[F], F]:
    """Decorator registering an advantage estimator under ``name``; a duplicate name raises."""

    def deco(fn: F) -> F:
        if name in _ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        _ESTIMATORS[name] = fn
        return fn

    return deco


def get_estimator(name: str) -> Callable[..., tuple[Tensor, Tensor]]:
    """Return the estimator registered as ``name`` (``KeyError`` lists the known names)."""
    try:
        return _ESTIMATORS[name]
    except KeyError:
        raise KeyError(
            f"unknown advantage estimator {name!r}; known: {sorted(_ESTIMATORS)}"
        ) from None


def list_estimators() -> list[str]:
    """Names of all registered estimators, sorted."""
    return sorted(_ESTIMATORS)


# --------------------------------------------------------------------------- helpers


def _check_mask(response_mask: Tensor, name: str = "response_mask") -> Tensor:
    if response_mask.dim() != 2:
        raise ValueError(f"{name} must be [B, T], got shape {tuple(response_mask.shape)}")
    # skip no-op conversions: every dispatch costs microseconds on this O(B) path
    return response_mask if response_mask.dtype == torch.bool else response_mask.bool()


def _float_dtype(*tensors: Tensor) -> torch.dtype:
    dt = torch.float32
    for t in tensors:
        if t.is_floating_point() and t.dtype != dt:
            dt = torch.promote_types(dt, t.dtype)
    return dt


def _outcome_scores(scores: Tensor, mask: Tensor) -> Tensor:
    """``[B]`` outcome rewards from ``scores`` [B] or token-level rewards [B, T] (masked sum)."""
    b = mask.shape[0]
    dt = _float_dtype(scores)
    if scores.dim() == 1:
        if scores.shape[0] != b:
            raise ValueError(f"scores has {scores.shape[0]} rows, response_mask has {b}")
        return scores if scores.dtype == dt else scores.to(dt)
    if scores.dim() == 2:
        if scores.shape != mask.shape:
            raise ValueError(
                f"token-level scores {tuple(scores.shape)} != response_mask {tuple(mask.shape)}"
            )
        return torch.where(mask, scores.to(dt), torch.zeros((), dtype=dt)).sum(-1)
    raise ValueError(f"scores must be [B] or [B, T], got shape {tuple(scores.shape)}")


def _single_segment_rows(mask: Tensor) -> bool:
    """True if every row's masked tokens form at most one contiguous run."""
    if mask.shape[1] < 2:
        return True
    starts = torch.empty_like(mask)  # [B, T]: a run of masked tokens begins here
    starts[:, :1] = mask[:, :1]
    torch.gt(mask[:, 1:], mask[:, :-1], out=starts[:, 1:])
    return bool((_row_lengths(starts, torch.int32) <= 1).all())


def _row_lengths(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Masked tokens per row ``[B]`` of a bool ``mask`` [B, T], exact, in one cheap pass.

    A contiguous bool row of ``T = 8 * W`` bytes is read as ``W`` int64 words; summing up to 255
    words never carries out of a byte lane (each byte is 0 or 1), so the row length is the sum of
    the 8 bytes of that word sum.  This reads the mask once at memory speed with no ``[B, T]``
    temporary (a plain ``mask.sum(-1)`` widens every element first and is ~20x slower).
    """
    b, t = mask.shape
    if mask.is_contiguous() and t % 8 == 0 and mask.storage_offset() % 8 == 0 and b * t > 0:
        words = mask.view(torch.int64)  # [B, W]
        total: Tensor | None = None
        for start in range(0, words.shape[1], 255):  # <= 255 words per partial sum: no carry
            part = words if words.shape[1] <= 255 else words[:, start : start + 255]
            # [8, B] view of the byte-lane counts (row r's 8 bytes are contiguous): reduce the 8
            # lanes vectorised across rows; the integers (<= 2040) are exact in float32/64
            lanes = part.sum(-1).view(torch.uint8).as_strided((8, b), (1, 8))
            count = lanes.sum(0, dtype=dtype)
            total = count if total is None else total + count
        assert total is not None
        return total
    return mask.view(torch.uint8).sum(-1, dtype=torch.int32).to(dtype)


def _broadcast(per_row: Tensor, mask: Tensor) -> Tensor:
    """``[B]`` -> ``[B, T]``: one pass that reads ``mask`` and writes the output; exactly 0 outside
    ``mask`` (``torch.where`` reads the bool mask directly, a multiply would widen it first)."""
    return torch.where(mask, per_row.unsqueeze(-1), 0.0)


def _token_rewards(scores: Tensor, mask: Tensor) -> Tensor:
    """Token-level rewards ``[B, T]``: 2-D passes through; 1-D goes on each row's last response token."""
    dt = _float_dtype(scores)
    if scores.dim() == 2:
        if scores.shape != mask.shape:
            raise ValueError(
                f"token-level scores {tuple(scores.shape)} != response_mask {tuple(mask.shape)}"
            )
        return scores if scores.dtype == dt else scores.to(dt)
    if scores.dim() != 1 or scores.shape[0] != mask.shape[0]:
        raise ValueError(f"scores must be [B] or [B, T], got shape {tuple(scores.shape)}")
    t = mask.shape[1]
    pos = torch.arange(t, device=mask.device).expand_as(mask)
    last = torch.where(mask, pos, torch.full_like(pos, -1)).amax(-1)  # [B], -1 for empty rows
    out = torch.zeros(mask.shape, dtype=dt, device=mask.device)
    has = last >= 0
    rows = torch.arange(mask.shape[0], device=mask.device)[has]
    out[rows, last[has]] = scores.to(dt)[has]
    return out


def _group_layout(s: Tensor, index: GroupIndex) -> tuple[Tensor, int, int]:
    """``(ids [B], G, k)``; ``k > 0`` when the rows come in consecutive groups of ``k >= 2`` (the
    rollout layout), so group statistics can run on an ``s.reshape(G, k)`` view."""
    ids, g = group_ids(index, s.shape[0], s.device)
    return ids, g, consecutive_group_size(ids, g)


def _centered(s: Tensor, index: GroupIndex, with_std: bool = True) -> tuple[Tensor, Tensor | None]:
    """``(s - mean_g(s), std_g(s))`` (unbiased std; ``None`` unless ``with_std``), broadcastable.

    Shapes are ``[G, k]`` and ``[G, 1]`` in the consecutive layout, ``[B]`` and ``[B]`` otherwise;
    ``.reshape(-1)`` of a result gives rows ``[B]``; the first is always a fresh tensor.  A group
    of one row gets mean 0 and std 1 (verl's convention: it keeps its raw score).
    """
    ids, g, k = _group_layout(s, index)
    if k:
        return dense_group_stats(s.reshape(g, k), with_std)
    if with_std:
        count, mean, std = group_stats(s, ids, g)
    else:
        (count, mean), std = group_count_mean(s, ids, g), None
    single = count <= 1  # singleton rule on the [G] statistics, then one gather each
    mean = torch.where(single, torch.zeros_like(mean), mean)
    if std is not None:
        std = torch.where(single, torch.ones_like(std), std).index_select(0, ids)
    return s - mean.index_select(0, ids), std


# --------------------------------------------------------------------------- token-level


@register_estimator("gae")
@torch.no_grad()
def gae(
    rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016, arXiv:1506.02438).

    ``delta_t = r_t + gamma * V_{t'} - V_t`` with ``t'`` the next response token (``V = 0`` after
    the last), ``A_t = sum_k (gamma * lam)**k * delta_{t+k}`` over response tokens, ``R_t = A_t +
    V_t``.  Tokens outside the mask are skipped (multi-turn env tokens do not break the recursion)
    and their rewards ignored.  Vectorised over B and T (blocked scan, see ``_scan``).

    Args:
        rewards: ``[B, T]`` token-level rewards.
        values: ``[B, T]`` critic values.
        response_mask: ``[B, T]`` bool.
    Returns:
        ``(advantages [B, T], returns [B, T])``.
    """
    mask = _check_mask(response_mask)
    if rewards.shape != mask.shape or values.shape != mask.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and response_mask "
            f"{tuple(mask.shape)} must all be [B, T]"
        )
    dt = _float_dtype(rewards, values)
    r, v = rewards.to(dt), values.to(dt)
    if _single_segment_rows(mask):
        # Each row's response is contiguous: the next response token of t is t + 1 (if masked),
        # so no compaction is needed. Every [B, T] pass costs ~0.1 ms at B=64, T=4096 on one
        # thread: write each temporary once, then update it in place.
        zero = torch.zeros((), dtype=dt, device=v.device)
        v_resp = torch.where(mask, v, zero)  # V at response tokens, 0 elsewhere
        delta = torch.empty_like(v_resp)
        torch.add(r[:, :-1], v_resp[:, 1:], alpha=gamma, out=delta[:, :-1])
        delta[:, -1:] = r[:, -1:]  # V = 0 after the last token
        delta.sub_(v_resp)
        torch.where(mask, delta, zero, out=delta)  # rewards and deltas outside: 0
        adv = discounted_reverse_cumsum(delta, gamma * lam)
        torch.where(mask, adv, zero, out=adv)
        return adv, adv + v_resp
    slot, rank = compaction(mask)
    r_c, v_c = compact(r, slot), compact(v, slot)
    next_v = torch.zeros_like(v_c)
    next_v[:, :-1] = v_c[:, 1:]
    delta = r_c + gamma * next_v - v_c
    adv = discounted_reverse_cumsum(delta, gamma * lam).gather(1, rank)
    zero = torch.zeros((), dtype=dt, device=adv.device)
    adv = torch.where(mask, adv, zero)
    returns = torch.where(mask, adv + v, zero)
    return adv, returns


@register_estimator("reinforce")
@torch.no_grad()
def reinforce_returns(
    scores: Tensor,
    response_mask: Tensor,
    index: GroupIndex | None = None,
    *,
    gamma: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Plain REINFORCE (Williams 1992): advantage = discounted reward-to-go, no baseline.

    Args:
        scores: ``[B]`` outcome (placed on the last response token) or ``[B, T]`` token rewards.
        response_mask: ``[B, T]``.  index: unused.
    Returns:
        ``(advantages, returns)``, both the reward-to-go ``[B, T]``.
    """
    mask = _check_mask(response_mask)
    ret = masked_discounted_returns(_token_rewards(scores, mask), mask, gamma)
    return ret, ret


@register_estimator("reinforce_plus_plus")
@torch.no_grad()
def reinforce_pp(
    scores: Tensor,
    response_mask: Tensor,
    index: GroupIndex | None = None,
    *,
    gamma: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): reward-to-go whitened over the whole batch.

    ``G_t = sum_{s >= t} gamma**(s-t) r_s``; ``A = (G - mean(G)) / std(G)`` over all masked tokens.

    Args:
        scores: ``[B]`` outcome (placed on the last response token) or ``[B, T]`` token rewards.
        response_mask: ``[B, T]``.  index: unused (batch-level baseline).
    Returns:
        ``(advantages [B, T], returns [B, T])``.
    """
    mask = _check_mask(response_mask)
    ret = masked_discounted_returns(_token_rewards(scores, mask), mask, gamma)
    return masked_whiten(ret, mask), ret


# --------------------------------------------------------------------------- outcome / group


@register_estimator("grpo")
@torch.no_grad()
def grpo(
    scores: Tensor,
    response_mask: Tensor,
    index: GroupIndex,
    *,
    epsilon: float = 1e-6,
    norm_by_std: bool = True,
) -> tuple[Tensor, Tensor]:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + epsilon)`` with the unbiased group std; with
    ``norm_by_std=False`` it is ``r_i - mean_g(r)`` — Dr.GRPO (Liu et al. 2025, arXiv:2503.20783).
    A group of one row keeps its raw score (mean 0, std 1; verl's convention).

    Args:
        scores: ``[B]`` or ``[B, T]`` (summed over the response).
        response_mask: ``[B, T]``.  index: ``[B]`` group key per row.
    Returns:
        ``(advantages [B, T], returns [B, T])`` (same tensor).
    """
    mask = _check_mask(response_mask)
    s = _outcome_scores(scores, mask)
    dev, std = _centered(s, index, with_std=norm_by_std)
    a = dev if std is None else dev.div_(std + epsilon)  # dev is fresh: normalise in place
    adv = _broadcast(a.reshape(-1), mask)
    return adv, adv


dr_grpo = partial(grpo, norm_by_std=False)
dr_grpo.__doc__ = "Dr.GRPO (arXiv:2503.20783): ``grpo`` with ``norm_by_std=False``."
register_estimator("dr_grpo")(dr_grpo)


@register_estimator("rloo")
@torch.no_grad()
def rloo(scores: Tensor, response_mask: Tensor, index: GroupIndex) -> tuple[Tensor, Tensor]:
    """RLOO leave-one-out baseline (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740).

    ``A_i = r_i - (1/(n-1)) sum_{j != i} r_j = n/(n-1) (r_i - mean_g(r))``; a group of one keeps
    its raw score.

    Args:
        scores: ``[B]`` or ``[B, T]``.  response_mask: ``[B, T]``.  index: ``[B]``.
    Returns:
        ``(advantages [B, T], returns [B, T])`` (same tensor).
    """
    mask = _check_mask(response_mask)
    s = _outcome_scores(scores, mask)
    ids, g, k = _group_layout(s, index)
    if k:
        v = s.reshape(g, k)
        a = ((v - v.sum(1, keepdim=True) / k) * (k / (k - 1.0))).reshape(-1)
    else:
        count, mean = group_count_mean(s, ids, g)
        n = count.index_select(0, ids)
        a = torch.where(n > 1, (s - mean.index_select(0, ids)) * n / (n - 1.0).clamp(min=1.0), s)
    adv = _broadcast(a, mask)
    return adv, adv


@register_estimator("reinforce_plus_plus_baseline")
@torch.no_grad()
def reinforce_pp_baseline(
    scores: Tensor, response_mask: Tensor, index: GroupIndex
) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline (Hu 2025, arXiv:2501.03262 v3): group-mean baseline, batch whitening.

    ``a_i = r_i - mean_g(r)`` (a group of one keeps its score), broadcast over the response, then
    whitened over all masked tokens of the batch.

    Args:
        scores: ``[B]`` or ``[B, T]``.  response_mask: ``[B, T]``.  index: ``[B]``.
    Returns:
        ``(advantages [B, T], returns [B, T])`` (same tensor).
    """
    mask = _check_mask(response_mask)
    s = _outcome_scores(scores, mask)
    a = _centered(s, index, with_std=False)[0].reshape(-1)
    # masked_whiten of the broadcast matrix, with its statistics computed per row (O(B)):
    # every row contributes n_b copies of a_b.
    n = _row_lengths(mask, a.dtype)
    total = float(n.sum())  # one sync; an exact integer, so the divisions below match tensors'
    d = a - torch.dot(n, a) / max(total, 1.0)
    if total > 1:
        d.mul_(torch.rsqrt(torch.dot(n, d * d) / (total - 1.0) + 1e-8))
    else:  # variance 0 by definition
        d.mul_(torch.rsqrt(torch.zeros((), dtype=d.dtype, device=d.device) + 1e-8))
    adv = _broadcast(d, mask)
    return adv, adv


@register_estimator("remax")
@torch.no_grad()
def remax(
    scores: Tensor,
    response_mask: Tensor,
    index: GroupIndex | None = None,
    *,
    baseline_scores: Tensor,
) -> tuple[Tensor, Tensor]:
    """ReMax (Li et al. 2024, arXiv:2310.10505): the greedy response's reward as baseline.

    ``G_t = sum_{s >= t} r_s`` (undiscounted reward-to-go), ``A_t = G_t - b`` with ``b`` the reward
    of the greedy decode of the same prompt.

    Args:
        scores: ``[B]`` or ``[B, T]``.  response_mask: ``[B, T]``.  index: unused.
        baseline_scores: ``[B]`` greedy-decode rewards.
    Returns:
        ``(advantages [B, T], returns [B, T])``.
    """
    mask = _check_mask(response_mask)
    if baseline_scores.shape != (mask.shape[0],):
        raise ValueError(
            f"baseline_scores must be [B={mask.shape[0]}], got {tuple(baseline_scores.shape)}"
        )
    ret = masked_discounted_returns(_token_rewards(scores, mask), mask, 1.0)
    adv = torch.where(
        mask, ret - baseline_scores.to(ret.dtype).unsqueeze(-1), torch.zeros_like(ret)
    )
    return adv, ret


@register_estimator("opo")
@torch.no_grad()
def opo(scores: Tensor, response_mask: Tensor, index: GroupIndex) -> tuple[Tensor, Tensor]:
    """OPO optimal baseline (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline").

    ``b_g = sum_j |o_j| r_j / sum_j |o_j|`` (length-weighted group mean), ``A_i = r_i - b_g``;
    a group of one (or with zero total length) uses ``b = 0``.

    Args:
        scores: ``[B]`` or ``[B, T]``.  response_mask: ``[B, T]``.  index: ``[B]``.
    Returns:
        ``(advantages [B, T], returns [B, T])`` (same tensor).
    """
    mask = _check_mask(response_mask)
    s = _outcome_scores(scores, mask)
    ids, g, k = _group_layout(s, index)
    lengths = _row_lengths(mask, s.dtype)
    if k:
        v, lv = s.reshape(g, k), lengths.reshape(g, k)
        tot_len = lv.sum(1, keepdim=True)
        # a group with zero total length has only empty rows, whose advantages are 0 anyway
        base = (lv * v).sum(1, keepdim=True) / tot_len.clamp(min=1e-12)  # [G, 1]
        a = (v - base).reshape(-1)
    else:
        tot_len = group_sum(lengths, ids, g)
        base = group_sum(lengths * s, ids, g) / tot_len.clamp(min=1e-12)
        count = torch.bincount(ids, minlength=g)
        base = torch.where((count > 1) & (tot_len > 0), base, torch.zeros_like(base))  # [G]
        a = s - base.index_select(0, ids)
    adv = _broadcast(a, mask)
    return adv, adv


@register_estimator("gpg")
@torch.no_grad()
def gpg(
    scores: Tensor,
    response_mask: Tensor,
    index: GroupIndex,
    *,
    f_norm: float = 1.0,
    alpha: float | None = None,
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """GPG, Group Policy Gradient (Chu et al. 2025, arXiv:2504.02546).

    ``A_i = alpha * (r_i - mean_g(r)) / F_norm`` with ``alpha = B / B_valid``, where ``B_valid``
    counts rows of groups whose rewards are not all equal (rows of degenerate groups carry no
    gradient; alpha rescales so the batch gradient is not diluted).

    Args:
        scores: ``[B]`` or ``[B, T]``.  response_mask: ``[B, T]``.  index: ``[B]``.
        f_norm: ``F_norm``.  alpha: override the computed ``alpha``.
    Returns:
        ``(advantages [B, T], returns [B, T])`` (same tensor).
    """
    mask = _check_mask(response_mask)
    s = _outcome_scores(scores, mask)
    ids, g, k = _group_layout(s, index)
    if k:
        dev, std = dense_group_stats(s.reshape(g, k))
        assert std is not None
        dev = dev.reshape(-1)
        valid = (std > epsilon).sum().to(s.dtype) * k
    else:
        count, mean, std = group_stats(s, ids, g)
        dev = s - mean.index_select(0, ids)
        # rows of groups with std > epsilon, counted on the [G] statistics
        valid = torch.where(std > epsilon, count, torch.zeros_like(count)).sum()
    if alpha is None:
        scale = s.shape[0] / valid.clamp(min=1.0)
    else:
        scale = torch.tensor(alpha, dtype=s.dtype, device=s.device)
    adv = _broadcast(scale * dev / f_norm, mask)
    return adv, adv


@register_estimator("grpo_passk")
@torch.no_grad()
def grpo_passk(
    scores: Tensor,
    response_mask: Tensor,
    index: GroupIndex,
    *,
    epsilon: float = 1e-6,
    norm_by_std: bool = True,
) -> tuple[Tensor, Tensor]:
    """Pass@k advantage (Tang et al. 2025, arXiv:2503.19595, as in verl's ``grpo_passk``).

    Only the best row of each group (first on ties) gets ``A = r_max - r_second``, optionally
    divided by ``std_g(r) + epsilon``; every other row gets 0.  Groups need at least two rows.

    Args:
        scores: ``[B]`` or ``[B, T]``.  response_mask: ``[B, T]``.  index: ``[B]``.
    Returns:
        ``(advantages [B, T], returns [B, T])`` (same tensor).
    """
    mask = _check_mask(response_mask)
    s = _outcome_scores(scores, mask)
    b = s.shape[0]
    ids, g, k = _group_layout(s, index)
    if k:  # consecutive groups of k >= 2: the first maximal row of each [G, k] row is the best
        v = s.reshape(g, k)
        _, std = dense_group_stats(v)
        assert std is not None
        gmax, best = torch.max(v, 1, keepdim=True)  # documented: index of the first maximum
        second = v.scatter(1, best, float("-inf")).amax(1, keepdim=True)
        gap = gmax - second
        if norm_by_std:
            gap = gap / (std + epsilon)
        adv = _broadcast(torch.zeros_like(v).scatter_(1, best, gap).reshape(-1), mask)
        return adv, adv
    count, _, std = group_stats(s, ids, g)
    if bool((count == 1).any()):
        gid = int((count == 1).nonzero()[0, 0])
        row = int((ids == gid).nonzero()[0, 0])
        raise ValueError(f"grpo_passk needs >= 2 rows per group; the group of row {row} has one")
    neg_inf = torch.full((g,), float("-inf"), dtype=s.dtype, device=s.device)
    gmax = neg_inf.scatter_reduce(0, ids, s, reduce="amax")
    rows = torch.arange(b, device=s.device)
    cand = torch.where(s == gmax.index_select(0, ids), rows, torch.full_like(rows, b))
    best = torch.full((g,), b, dtype=torch.long, device=s.device).scatter_reduce(
        0, ids, cand, reduce="amin"
    )
    is_best = best.index_select(0, ids) == rows
    second = neg_inf.scatter_reduce(
        0, ids, torch.where(is_best, torch.full_like(s, float("-inf")), s), reduce="amax"
    )
    gap = gmax - second
    if norm_by_std:
        gap = gap / (std + epsilon)
    a = torch.where(is_best, gap.index_select(0, ids), torch.zeros_like(s))
    adv = _broadcast(a, mask)
    return adv, adv


def _norm_in_groups(x: Tensor, ids: Tensor, g: int, norm_by_std: bool, epsilon: float) -> Tensor:
    _, mean, std = group_stats(x, ids, g)
    a = x - mean.index_select(0, ids)
    return a / (std.index_select(0, ids) + epsilon) if norm_by_std else a


def _step_returns(
    tid: Tensor, n_traj: int, step_ids: Tensor, step_rewards: Tensor, gamma: float, who: str
) -> Tensor:
    """Discounted return of each step row inside its trajectory, ``[B]``:
    ``G_t = sum_{k >= t} gamma**(k-t) r_k`` over the steps ``k`` of the row's trajectory.

    ``tid [B]``: dense trajectory id (``< n_traj``); ``step_ids [B]``: int turn index (>= 0, at
    most one row per (trajectory, step); missing steps count as reward 0); ``step_rewards [B]``.
    Built as an ``[n_traj, S]`` matrix and reduced with a blocked reverse scan.
    """
    dev, b = step_rewards.device, step_rewards.shape[0]
    steps = step_ids.to(device=dev, dtype=torch.long)
    if bool((steps < 0).any()):
        raise ValueError(f"{who}: step_ids must be >= 0")
    n_steps = int(steps.max()) + 1 if b else 0
    flat = tid * n_steps + steps
    if bool((torch.bincount(flat, minlength=n_traj * n_steps) > 1).any()):
        raise ValueError(f"{who}: a (trajectory, step) pair occurs in more than one row")
    mat = torch.zeros(n_traj * n_steps, dtype=step_rewards.dtype, device=dev)
    mat[flat] = step_rewards
    return discounted_reverse_cumsum(mat.view(n_traj, n_steps), gamma).reshape(-1)[flat]


@register_estimator("gigpo")
@torch.no_grad()
def gigpo(
    scores: Tensor,
    response_mask: Tensor,
    index: GroupIndex,
    *,
    traj_ids: GroupIndex,
    step_ids: Tensor,
    step_rewards: Tensor,
    anchor_ids: Tensor | Sequence[Hashable],
    gamma: float = 0.95,
    step_weight: float = 1.0,
    episode_weight: float = 1.0,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """GiGPO, Group-in-Group Policy Optimization (Feng et al. 2025, arXiv:2505.10978).

    Rows are *steps* (one model turn each).  ``A = episode_weight * A^E + step_weight * A^S`` where

    - episode level: ``A^E = (R(τ) - mean) / std`` over the distinct trajectories of the episode
      group ``index`` (each trajectory counted once, a group of one keeps ``R``);
    - step level (anchor states): rows of the same episode group whose ``anchor_ids`` (e.g. a hash
      of the observation) are equal form a step group; ``G_t = sum_{k >= t} gamma**(k-t) r_k`` is
      the discounted return of the row's trajectory from this step; ``A^S = (G_t - mean) / std``
      in the step group (a step group of one gets 0).

    Args:
        scores: ``[B]`` episode return of each row's trajectory (equal within a trajectory).
        response_mask: ``[B, T]`` (the step's response tokens).
        index: ``[B]`` episode group (same env seed/prompt) per row.
        traj_ids: ``[B]`` trajectory key per row.  step_ids: ``[B]`` int turn index in it.
        step_rewards: ``[B]`` reward of this step.  anchor_ids: ``[B]`` state key per row.
    Returns:
        ``(advantages [B, T], returns [B, T])`` (same tensor).
    """
    mask = _check_mask(response_mask)
    s = _outcome_scores(scores, mask)
    b, dev = s.shape[0], s.device
    if step_ids.shape != (b,) or step_rewards.shape != (b,):
        raise ValueError(
            f"step_ids {tuple(step_ids.shape)} and step_rewards {tuple(step_rewards.shape)} must be [B={b}]"
        )
    ids, _ = group_ids(index, b, dev)
    tid, n_traj = group_ids(traj_ids, b, dev)
    # one score / group per trajectory (validated)
    lo = torch.full((n_traj,), float("inf"), dtype=s.dtype, device=dev).scatter_reduce(
        0, tid, s, reduce="amin"
    )
    hi = torch.full((n_traj,), float("-inf"), dtype=s.dtype, device=dev).scatter_reduce(
        0, tid, s, reduce="amax"
    )
    bad = (hi != lo) & torch.isfinite(hi)
    if bool(bad.any()):
        row = int((bad.index_select(0, tid)).nonzero()[0, 0])
        raise ValueError(f"gigpo: scores differ within the trajectory of row {row}")
    present = torch.isfinite(hi)
    traj_group = torch.zeros(n_traj, dtype=torch.long, device=dev).scatter_(0, tid, ids)
    t_ids, t_g = group_ids(traj_group[present], int(present.sum()), dev)
    t_count, t_mean, t_std = group_stats(hi[present], t_ids, t_g)
    single = t_count.index_select(0, t_ids) <= 1
    t_a = hi[present] - torch.where(
        single, torch.zeros_like(t_mean.index_select(0, t_ids)), t_mean.index_select(0, t_ids)
    )
    if norm_by_std:
        t_a = t_a / (
            torch.where(
                single, torch.ones_like(t_std.index_select(0, t_ids)), t_std.index_select(0, t_ids)
            )
            + epsilon
        )
    ep_adv_traj = torch.zeros(n_traj, dtype=s.dtype, device=dev)
    ep_adv_traj[present] = t_a
    ep_adv = ep_adv_traj.index_select(0, tid)
    step_ret = _step_returns(tid, n_traj, step_ids, step_rewards.to(dev, s.dtype), gamma, "gigpo")
    # anchor-state step groups inside episode groups
    aid, n_anchor = group_ids(anchor_ids, b, dev)
    sg_ids, sg = group_ids(ids * max(n_anchor, 1) + aid, b, dev)
    st_adv = _norm_in_groups(step_ret, sg_ids, sg, norm_by_std, epsilon)
    adv = _broadcast(episode_weight * ep_adv + step_weight * st_adv, mask)
    return adv, adv


@register_estimator("step_reinforce")
@torch.no_grad()
def step_reinforce(
    scores: Tensor,
    response_mask: Tensor,
    index: GroupIndex,
    *,
    traj_ids: GroupIndex,
    step_ids: Tensor,
    step_rewards: Tensor,
    gamma: float = 0.95,
    token_gamma: float = 1.0,
    method: str = "mean_std",
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """Per-step REINFORCE (ROLL's ``adv_estimator: step_reinforce``, its step-wise agentic runs).

    Rows are *steps* (one model turn each).  ``G_t = sum_{k >= t} gamma**(k-t) r_k`` is the
    discounted return of the row's trajectory from this step (``gamma``: ROLL's
    ``step_reward_gamma``); the returns are normalised over the rows of each group ``index`` by
    ``method`` (``rl_algos.rewards.normalize_rewards``: the run's reward normalisation), put on
    the step's last response token and turned into a token reward-to-go with ``token_gamma``
    (ROLL's ``gamma``; 1.0 gives every token of the step the normalised return).  No critic, no
    state grouping: unlike ``gigpo`` a step is compared with all steps of its group.

    Args:
        scores: ``[B]`` or ``[B, T]``: only checked (the outcome enters through ``step_rewards``).
        response_mask: ``[B, T]`` (the step's response tokens).
        index: ``[B]`` normalisation group per row (episode group, tag, or one group).
        traj_ids: ``[B]`` trajectory key per row.  step_ids: ``[B]`` int turn index in it.
        step_rewards: ``[B]`` reward of this step.
    Returns:
        ``(advantages [B, T], returns [B, T])`` (same tensor).
    """
    mask = _check_mask(response_mask)
    s = _outcome_scores(scores, mask)
    b, dev = s.shape[0], s.device
    if step_ids.shape != (b,) or step_rewards.shape != (b,):
        raise ValueError(
            f"step_ids {tuple(step_ids.shape)} and step_rewards {tuple(step_rewards.shape)} "
            f"must be [B={b}]"
        )
    tid, n_traj = group_ids(traj_ids, b, dev)
    step_ret = _step_returns(
        tid, n_traj, step_ids, step_rewards.to(dev, s.dtype), gamma, "step_reinforce"
    )
    normed = normalize_rewards(
        step_ret, grouping="group", method=method, index=index, epsilon=epsilon
    )
    adv = masked_discounted_returns(_token_rewards(normed, mask), mask, token_gamma)
    return adv, adv


@register_estimator("optimal_token_baseline")
@torch.no_grad()
def optimal_token_baseline(
    scores: Tensor,
    response_mask: Tensor,
    index: GroupIndex,
    *,
    old_log_probs: Tensor,
    sum_pi_squared: Tensor,
    epsilon: float = 1e-8,
) -> tuple[Tensor, Tensor]:
    """Optimal token baseline (OTB, verl's ``optimal_token_baseline``): a baseline per group and
    response position, the returns weighted by each row's accumulated path variance.

    For row ``i`` at its ``t``-th response token (positions count response tokens, so rows whose
    responses start at different columns are aligned; masked-out tokens are skipped):

    * ``G_t`` the reward-to-go (undiscounted), ``pi_t = exp(old_log_probs_t)`` the probability of
      the sampled token, ``w_t = 1 - 2 pi_t + sum_pi_squared_t`` (``||e_token - pi||^2``, the
      squared norm of the log-softmax gradient's logit part: a per-token variance proxy);
    * ``W_t = w_1 + ... + w_t`` (the path variance so far);
    * ``B_t = sum_i G_{i,t} W_{i,t} / (sum_i W_{i,t} + epsilon)`` over the rows of the group that
      have a ``t``-th token; ``A_t = G_t - B_t``. A group of one row keeps ``A = G``.

    Example (hand-derived): one group, outcome scores ``[1, 0]``, two tokens each; row 0 with
    ``pi = [0.5, 1]``, ``sum_pi_squared = [0.5, 1]`` (``w = [0.5, 0]``, ``W = [0.5, 0.5]``), row 1
    with ``pi = [0.25, 0.5]``, ``sum_pi_squared = [0.25, 0.5]`` (``w = [0.75, 0.5]``,
    ``W = [0.75, 1.25]``): ``B = [0.5 / 1.25, 0.5 / 1.75] = [0.4, 2/7]``, so row 0 gets
    ``[0.6, 5/7]`` and row 1 ``[-0.4, -2/7]``.

    Args:
        scores: ``[B]`` outcome (on the last response token) or ``[B, T]`` token rewards.
        response_mask: ``[B, T]``.  index: ``[B]`` group of each row.
        old_log_probs: ``[B, T]`` log-probs of the sampled tokens under the policy that sampled
            them.  sum_pi_squared: ``[B, T]`` ``sum_v pi(v)^2`` of that policy at each token.
        epsilon: added to the denominator.
    Returns:
        ``(advantages [B, T], returns [B, T])``: the returns are ``G``.
    """
    mask = _check_mask(response_mask)
    for name, t in (("old_log_probs", old_log_probs), ("sum_pi_squared", sum_pi_squared)):
        if t.shape != mask.shape:
            raise ValueError(f"{name} {tuple(t.shape)} != response_mask {tuple(mask.shape)}")
    rewards = _token_rewards(scores, mask)
    dt = _float_dtype(rewards, old_log_probs, sum_pi_squared)
    returns = masked_discounted_returns(rewards.to(dt), mask, 1.0)  # [B, T], 0 outside the mask
    w = 1.0 - 2.0 * old_log_probs.to(dt).exp() + sum_pi_squared.to(dt)
    slot, rank = compaction(mask)  # column j of a compacted row: its j-th response token
    m = compact(mask.to(dt), slot)
    g_c = compact(returns, slot)
    w_c = compact(torch.where(mask, w, torch.zeros((), dtype=dt)), slot).cumsum(1) * m
    ids, g = group_ids(index, mask.shape[0], mask.device)
    new = partial(torch.zeros, dtype=dt, device=mask.device)
    num = new(g, mask.shape[1]).index_add_(0, ids, g_c * w_c)
    den = new(g, mask.shape[1]).index_add_(0, ids, w_c) + epsilon
    count = new(g).index_add_(0, ids, torch.ones_like(ids, dtype=dt))
    baseline = (num / den).index_select(0, ids) * (count.index_select(0, ids) > 1).unsqueeze(-1)
    adv = (g_c - baseline).gather(1, rank)
    zero = torch.zeros((), dtype=dt)
    return torch.where(mask, adv, zero), returns


register_estimator("reinforce_pp")(reinforce_pp)
register_estimator("reinforce_pp_baseline")(reinforce_pp_baseline)
