"""Reward shaping: normalisation (group / batch / running), clipping, whitening, DAPO overlong
penalty, Kimi length penalty and DAPO's dynamic-sampling filter.

Normalisation follows ROLL's ``reward_normalization`` (``grouping`` + ``method``):

- ``mean_std``:  ``(r - mean) / (std + eps)``
- ``mean``:      ``r - mean``
- ``asym_clip``: ``mean_std`` then clamped to ``[asym_low, asym_high]`` (default ``[-1, 3]``,
  the RAGEN/StarPO choice: bad outcomes cannot dominate), 0 for groups with zero spread
- ``identity``:  unchanged

``grouping="group"`` uses per-``index`` statistics, ``"batch"`` the whole batch and ``"running"``
a ``RunningMeanStd`` updated with this batch first.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rl_algos._groups import GroupIndex, group_ids, group_stats
from rl_algos.aggregate import masked_whiten

__all__ = [
    "RunningMeanStd",
    "clip_advantages",
    "clip_rewards",
    "dynamic_sampling_mask",
    "length_penalty",
    "normalize_rewards",
    "overlong_penalty",
    "whiten",
]

NORM_METHODS = ("mean_std", "mean", "asym_clip", "identity")
GROUPINGS = ("group", "batch", "running")


class RunningMeanStd:
    """Running mean/variance over all values seen (parallel Welford merge, Chan et al. 1979).

    State is kept in float64 on the CPU; ``state_dict``/``load_state_dict`` round-trip it for
    checkpoints.
    """

    def __init__(self, epsilon: float = 1e-4) -> None:
        self.mean = 0.0
        self.var = 1.0
        self.count = epsilon

    def update(self, x: Tensor) -> None:
        """Merge the statistics of all elements of ``x`` (any shape)."""
        x = x.detach().to("cpu", torch.float64).reshape(-1)
        n = x.numel()
        if n == 0:
            return
        b_mean, b_var = float(x.mean()), float(x.var(unbiased=False))
        delta = b_mean - self.mean
        tot = self.count + n
        m2 = self.var * self.count + b_var * n + delta * delta * self.count * n / tot
        self.mean += delta * n / tot
        self.var = m2 / tot
        self.count = tot

    @property
    def std(self) -> float:
        return self.var**0.5

    def state_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean, self.var, self.count = (
            float(state["mean"]),
            float(state["var"]),
            float(state["count"]),
        )


def _apply_method(
    r: Tensor, mean: Tensor, std: Tensor, method: str, eps: float, asym_low: float, asym_high: float
) -> Tensor:
    if method == "identity":
        return r
    if method == "mean":
        return r - mean
    if method == "mean_std":
        return (r - mean) / (std + eps)
    if method == "asym_clip":
        z = torch.where(std > eps, (r - mean) / (std + eps), torch.zeros_like(r))
        return z.clamp(asym_low, asym_high)
    raise ValueError(f"unknown normalisation method {method!r}; expected one of {NORM_METHODS}")


def normalize_rewards(
    scores: Tensor,
    *,
    grouping: str = "group",
    method: str = "mean_std",
    index: GroupIndex | None = None,
    running: RunningMeanStd | None = None,
    epsilon: float = 1e-6,
    asym_low: float = -1.0,
    asym_high: float = 3.0,
) -> Tensor:
    """Normalise outcome rewards ``[B]`` (ROLL ``reward_normalization``).

    Args:
        scores: ``[B]``.
        grouping: ``group`` (needs ``index``), ``batch`` or ``running`` (needs ``running``; it is
            updated with ``scores`` before use).
        method: ``mean_std``, ``mean``, ``asym_clip`` or ``identity``.
    Returns:
        ``[B]`` float.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be [B], got {tuple(scores.shape)}")
    if method not in NORM_METHODS:
        raise ValueError(f"unknown normalisation method {method!r}; expected one of {NORM_METHODS}")
    r = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if method == "identity":
        return r
    if grouping == "group":
        if index is None:
            raise ValueError("grouping='group' needs index (group id per row)")
        ids, g = group_ids(index, r.shape[0], r.device)
        _, mean, std = group_stats(r, ids, g)
        mean_r, std_r = mean[ids], std[ids]
    elif grouping == "batch":
        mean_r = r.mean() if r.numel() else r.new_zeros(())
        std_r = r.std() if r.numel() > 1 else r.new_zeros(())
    elif grouping == "running":
        if running is None:
            raise ValueError("grouping='running' needs a RunningMeanStd in `running`")
        running.update(r)
        mean_r, std_r = r.new_tensor(running.mean), r.new_tensor(running.std)
    else:
        raise ValueError(f"unknown grouping {grouping!r}; expected one of {GROUPINGS}")
    return _apply_method(r, mean_r, std_r, method, epsilon, asym_low, asym_high)


def clip_rewards(rewards: Tensor, clip: float | None) -> Tensor:
    """Clamp rewards to ``[-clip, clip]`` (ROLL ``reward_clip``); ``None`` returns them as is."""
    return rewards if clip is None else rewards.clamp(-clip, clip)


def clip_advantages(advantages: Tensor, clip: float | None) -> Tensor:
    """Clamp advantages to ``[-clip, clip]`` (ROLL ``advantage_clip``); ``None``: unchanged."""
    return advantages if clip is None else advantages.clamp(-clip, clip)


def whiten(values: Tensor, response_mask: Tensor, shift_mean: bool = True) -> Tensor:
    """``masked_whiten`` over the batch (ROLL ``whiten_rewards`` / ``whiten_advantages``), ``[B, T]``."""
    return masked_whiten(values, response_mask, shift_mean=shift_mean)


def overlong_penalty(
    response_lengths: Tensor,
    max_response_length: int,
    buffer_length: int,
    penalty_factor: float = 1.0,
) -> Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, Eq. 13).

    With ``L_max = max_response_length`` and cache ``L_c = buffer_length``:
    0 if ``|y| <= L_max - L_c``; ``((L_max - L_c) - |y|) / L_c * factor`` inside the buffer;
    ``-factor`` beyond ``L_max``.

    Args:
        response_lengths: ``[B]`` number of response tokens.
    Returns:
        ``[B]`` non-positive penalty to add to the reward.
    """
    if buffer_length <= 0 or buffer_length > max_response_length:
        raise ValueError(
            f"buffer_length must be in (0, max_response_length={max_response_length}], got {buffer_length}"
        )
    expected = max_response_length - buffer_length
    excess = response_lengths.float() - expected
    return (-excess / buffer_length * penalty_factor).clamp(-penalty_factor, 0.0)


def length_penalty(
    response_lengths: Tensor, correct: Tensor, index: GroupIndex, *, weight: float = 1.0
) -> Tensor:
    """Kimi k1.5 length reward (Kimi Team 2025, arXiv:2501.12599, §2.3.3), per group.

    ``lambda = 0.5 - (len - min_len) / (max_len - min_len)`` within the group (0 when all lengths
    are equal); correct answers get ``lambda``, wrong ones ``min(0, lambda)``; times ``weight``.

    Args:
        response_lengths: ``[B]``; correct: ``[B]`` bool; index: ``[B]`` group per row.
    Returns:
        ``[B]`` reward to add.
    """
    n = response_lengths.shape[0]
    if correct.shape != (n,):
        raise ValueError(f"correct must be [B={n}], got {tuple(correct.shape)}")
    length = response_lengths.float()
    ids, g = group_ids(index, n, length.device)
    lo = torch.full((g,), float("inf"), device=length.device).scatter_reduce(0, ids, length, "amin")
    hi = torch.full((g,), float("-inf"), device=length.device).scatter_reduce(
        0, ids, length, "amax"
    )
    span = (hi - lo)[ids]
    lam = torch.where(
        span > 0, 0.5 - (length - lo[ids]) / span.clamp(min=1e-12), torch.zeros_like(length)
    )
    return weight * torch.where(correct.bool(), lam, lam.clamp(max=0.0))


def dynamic_sampling_mask(scores: Tensor, index: GroupIndex, *, atol: float = 0.0) -> Tensor:
    """DAPO dynamic sampling (arXiv:2503.14476): keep rows whose group's rewards are not all equal.

    Args:
        scores: ``[B]``; index: ``[B]``; atol: spreads ``<= atol`` count as equal.
    Returns:
        ``[B]`` bool, True = keep.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be [B], got {tuple(scores.shape)}")
    s = scores.float()
    ids, g = group_ids(index, s.shape[0], s.device)
    lo = torch.full((g,), float("inf"), device=s.device).scatter_reduce(0, ids, s, "amin")
    hi = torch.full((g,), float("-inf"), device=s.device).scatter_reduce(0, ids, s, "amax")
    return (hi - lo)[ids] > atol
