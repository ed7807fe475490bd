"""Policy, value, KL, entropy, preference and SFT losses.

Policy losses share one signature::

    fn(log_probs, old_log_probs, advantages, response_mask, **options) -> PolicyLossOutput

with all tensors ``[B, T]`` aligned per CONTRACT.  They return the per-token loss matrix
``loss_mat`` (``[B, T]``, 0 outside the mask; reduce it with ``out.loss(mode)`` or
``rl_algos.aggregate.aggregate``) and ``stats``: detached scalar tensors (no ``.item()``, no host
sync).  Log-ratios are clamped to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]`` before ``exp``; ratios
and KL are computed in float32 (or float64 if the inputs are).  ``is_weights`` (optional ``[B, T]``,
e.g. truncated IS weights from ``rl_algos.correction``) multiplies the per-token loss.

Registry: ``get_policy_loss(name)``, ``register_policy_loss(name)``, ``list_policy_losses()``;
KL estimators: ``get_kl_estimator(name)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from rl_algos.aggregate import aggregate, masked_mean
from rl_algos.logprobs import entropy_from_logits

__all__ = [
    "LOG_RATIO_CLAMP",
    "PolicyLossOutput",
    "PreferenceLossOutput",
    "ValueLossOutput",
    "cispo",
    "clip_cov",
    "dpo",
    "entropy_from_logits",
    "get_kl_estimator",
    "get_policy_loss",
    "gmpo",
    "gspo",
    "ipo",
    "kl_cov",
    "kl_penalty",
    "kto",
    "list_policy_losses",
    "orpo",
    "pair_accuracy",
    "pair_ties",
    "ppo_clip",
    "register_policy_loss",
    "reinforce",
    "sapo",
    "sft_loss",
    "simpo",
    "topr",
    "value_loss",
]

LOG_RATIO_CLAMP = 20.0

FN = TypeVar("FN", bound=Callable[..., Any])
_POLICY_LOSSES: dict[str, Callable[..., PolicyLossOutput]] = {}


@dataclass(frozen=True)
class PolicyLossOutput:
    """Result of a policy loss.

    Attributes:
        loss_mat: ``[B, T]`` per-token loss (differentiable; 0 outside ``mask``).
        mask: ``[B, T]`` bool mask the loss is defined on.
        stats: detached scalar tensors (``clip_frac``, ``approx_kl``, ...).
    """

    loss_mat: Tensor
    mask: Tensor
    stats: dict[str, Tensor] = field(default_factory=dict)

    def loss(self, mode: str = "token-mean", **kwargs: Any) -> Tensor:
        """Scalar loss via ``aggregate(loss_mat, mask, mode, **kwargs)``."""
        return aggregate(self.loss_mat, self.mask, mode, **kwargs)


class ValueLossOutput(PolicyLossOutput):
    """Result of ``value_loss``: ``loss_mat [B, T]``, ``mask``, detached ``stats`` (same fields
    and ``loss(mode)`` as a policy loss result)."""


@dataclass(frozen=True)
class PreferenceLossOutput:
    """Result of a preference loss.

    Attributes:
        losses: ``[B]`` per-pair (or per-example for KTO) loss; ``losses.mean()`` is the usual loss.
        chosen_rewards: ``[B]`` detached implicit rewards of the chosen side (0 where undefined).
        rejected_rewards: ``[B]`` detached implicit rewards of the rejected side.
        stats: detached scalars (``reward_accuracy``, ``reward_margin``, ...).
    """

    losses: Tensor
    chosen_rewards: Tensor
    rejected_rewards: Tensor
    stats: dict[str, Tensor] = field(default_factory=dict)

    def loss(self) -> Tensor:
        """Mean over pairs."""
        return self.losses.mean()


def register_policy_loss(name: str) -> Callable[[FN], FN]:
    """Decorator registering a policy loss under ``name``; a duplicate name raises."""

    def deco(fn: FN) -> FN:
        if name in _POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        _POLICY_LOSSES[name] = fn
        return fn

    return deco


def get_policy_loss(name: str) -> Callable[..., PolicyLossOutput]:
    """Return the policy loss registered as ``name`` (``KeyError`` lists the known names)."""
    try:
        return _POLICY_LOSSES[name]
    except KeyError:
        raise KeyError(f"unknown policy loss {name!r}; known: {sorted(_POLICY_LOSSES)}") from None


def list_policy_losses() -> list[str]:
    return sorted(_POLICY_LOSSES)


# --------------------------------------------------------------------------- helpers


def _prep(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Validate shapes, promote to >= float32, return (log_probs, log_ratio, advantages, mask)."""
    for name, t in (("old_log_probs", old_log_probs), ("advantages", advantages)):
        if t.shape != log_probs.shape:
            raise ValueError(f"{name} {tuple(t.shape)} != log_probs {tuple(log_probs.shape)}")
    if response_mask.shape != log_probs.shape:
        raise ValueError(
            f"response_mask {tuple(response_mask.shape)} != log_probs {tuple(log_probs.shape)}"
        )
    dt = torch.promote_types(log_probs.dtype, torch.float32)
    lp = log_probs.to(dt)
    log_ratio = (lp - old_log_probs.to(dt)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return lp, log_ratio, advantages.to(dt).detach(), response_mask.bool()


def _finish(
    loss_mat: Tensor, mask: Tensor, is_weights: Tensor | None, stats: dict[str, Tensor]
) -> PolicyLossOutput:
    if is_weights is not None:
        if is_weights.shape != loss_mat.shape:
            raise ValueError(f"is_weights {tuple(is_weights.shape)} != {tuple(loss_mat.shape)}")
        loss_mat = loss_mat * is_weights.detach().to(loss_mat.dtype)
    loss_mat = torch.where(
        mask, loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device)
    )
    return PolicyLossOutput(loss_mat, mask, {k: v.detach() for k, v in stats.items()})


def _frac(cond: Tensor, mask: Tensor) -> Tensor:
    return masked_mean(cond.float(), mask)


def _base_stats(log_ratio: Tensor, mask: Tensor) -> dict[str, Tensor]:
    lr = log_ratio.detach()
    return {
        "approx_kl": masked_mean(-lr, mask),  # k1 estimate of KL(old || new)
        "ratio_mean": masked_mean(lr.exp(), mask),
        "ratio_max": torch.where(mask, lr, torch.full_like(lr, -LOG_RATIO_CLAMP)).amax().exp()
        if mask.numel()
        else lr.new_zeros(()),
    }


def _seq_to_token(seq_loss: Tensor, mask: Tensor) -> Tensor:
    """Spread a per-sequence loss ``[B]`` evenly over the row's masked tokens -> ``[B, T]``.

    Token sums per row then equal ``seq_loss`` (use ``seq-mean-token-sum`` to get its mean).
    """
    n = mask.sum(-1, keepdim=True).clamp(min=1).to(seq_loss.dtype)
    return (seq_loss.unsqueeze(-1) / n) * mask


# --------------------------------------------------------------------------- policy losses


@register_policy_loss("ppo")
@register_policy_loss("ppo_clip")
def ppo_clip(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float | None = None,
    is_weights: Tensor | None = None,
) -> PolicyLossOutput:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347).

    ``r = exp(log_probs - old_log_probs)``;
    ``L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))`` — asymmetric bounds are DAPO's
    clip-higher (Yu et al. 2025, arXiv:2503.14476).  Dual clip (Ye et al. 2020, arXiv:1912.09729):
    for ``A < 0``, ``L = min(L, -A c)`` with ``c = clip_ratio_c > 1``.

    Args:
        log_probs, old_log_probs, advantages, response_mask: ``[B, T]``.
        clip_ratio: symmetric epsilon, used where ``clip_ratio_low/high`` are None.
        clip_ratio_c: dual-clip constant (None disables; must be > 1).
    Returns:
        ``PolicyLossOutput`` with stats ``clip_frac``, ``clip_frac_lower`` (dual clip active),
        ``approx_kl``, ``ratio_mean``, ``ratio_max``.
    """
    lp, log_ratio, adv, mask = _prep(log_probs, old_log_probs, advantages, response_mask)
    lo = clip_ratio if clip_ratio_low is None else clip_ratio_low
    hi = clip_ratio if clip_ratio_high is None else clip_ratio_high
    ratio = log_ratio.exp()
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - lo, 1.0 + hi)
    loss = torch.maximum(pg1, pg2)
    stats = _base_stats(log_ratio, mask)
    stats["clip_frac"] = _frac(pg2 > pg1, mask)
    if clip_ratio_c is not None:
        if clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
        pg3 = -adv * clip_ratio_c
        dual = (adv < 0) & (pg3 < loss)
        loss = torch.where(adv < 0, torch.minimum(loss, pg3), loss)
        stats["clip_frac_lower"] = _frac(dual, mask)
    else:
        stats["clip_frac_lower"] = torch.zeros((), device=lp.device)
    return _finish(loss, mask, is_weights, stats)


@register_policy_loss("gspo")
def gspo(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    is_weights: Tensor | None = None,
) -> PolicyLossOutput:
    """GSPO, sequence-level clipped ratio (Zheng et al. 2025, arXiv:2507.18071), token form.

    ``s_i = exp(mean_t log r_{i,t})`` over the response; per token
    ``s_{i,t} = sg(s_i) * pi_t / sg(pi_t)`` (same value, token gradient ``s_i * grad log pi_t``);
    ``L = max(-A s_{i,t}, -A clip(s_{i,t}, 1 - eps_low, 1 + eps_high))``.  Use the
    ``seq-mean-token-mean`` aggregation to recover the paper's objective.
    """
    lp, log_ratio, adv, mask = _prep(log_probs, old_log_probs, advantages, response_mask)
    seq_lr = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    tok_lr = (seq_lr.detach().unsqueeze(-1) + lp - lp.detach()).clamp(max=10.0)
    ratio = tok_lr.exp()
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = torch.maximum(pg1, pg2)
    stats = _base_stats(log_ratio, mask)
    stats["clip_frac"] = _frac(pg2 > pg1, mask)
    stats["seq_ratio_mean"] = masked_mean(ratio.detach(), mask)
    return _finish(loss, mask, is_weights, stats)


@register_policy_loss("cispo")
def cispo(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio_low: float = 1.0,
    clip_ratio_high: float = 0.28,
    is_weights: Tensor | None = None,
) -> PolicyLossOutput:
    """CISPO, clipped IS-weight policy optimisation (MiniMax-M1, arXiv:2506.13585).

    ``L = -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log_probs`` — the IS weight is clipped and
    detached, every token keeps a gradient.  The default ``eps_low = 1`` means no lower bound.
    """
    lp, log_ratio, adv, mask = _prep(log_probs, old_log_probs, advantages, response_mask)
    ratio = log_ratio.exp()
    w = ratio.clamp(max(0.0, 1.0 - clip_ratio_low), 1.0 + clip_ratio_high).detach()
    loss = -w * adv * lp
    stats = _base_stats(log_ratio, mask)
    stats["clip_frac"] = _frac(w != ratio.detach(), mask)
    return _finish(loss, mask, is_weights, stats)


@register_policy_loss("gmpo")
def gmpo(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio_low: float = 0.4,
    clip_ratio_high: float = 0.4,
    is_weights: Tensor | None = None,
) -> PolicyLossOutput:
    """GMPO, geometric-mean policy optimisation (Zhao et al. 2025, arXiv:2507.20673).

    Per sequence with (sequence-constant) advantage ``A``: clipped in log space,
    ``l_t = sgn(A) * min(sgn(A) log r_t, sgn(A) clip(log r_t, -eps_low, eps_high))``,
    ``L_seq = -A * exp(mean_t l_t)``.  The sequence loss is spread evenly over the row's tokens, so
    ``seq-mean-token-sum`` aggregation gives the paper's mean over sequences.  ``A`` is read as the
    masked token mean of ``advantages`` per row.
    """
    _, log_ratio, adv, mask = _prep(log_probs, old_log_probs, advantages, response_mask)
    seq_adv = masked_mean(adv, mask, dim=-1)
    sgn = torch.sign(seq_adv).unsqueeze(-1)
    clipped = log_ratio.clamp(-clip_ratio_low, clip_ratio_high)
    l_tok = sgn * torch.minimum(sgn * log_ratio, sgn * clipped)
    seq_lr = (l_tok * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    seq_loss = -seq_adv * seq_lr.exp()
    loss = _seq_to_token(seq_loss, mask)
    stats = _base_stats(log_ratio, mask)
    stats["clip_frac"] = _frac(clipped != log_ratio, mask)
    return _finish(loss, mask, is_weights, stats)


def _centered_cov(adv: Tensor, lp: Tensor, mask: Tensor) -> Tensor:
    """``(A - mean A)(log p - mean log p)`` per token, means over masked tokens (detached)."""
    a, p = adv.detach(), lp.detach()
    return (a - masked_mean(a, mask)) * (p - masked_mean(p, mask))


@register_policy_loss("clip_cov")
def clip_cov(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio: float = 0.2,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
    is_weights: Tensor | None = None,
) -> PolicyLossOutput:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv:2505.22617).

    Tokens whose centred covariance ``(A - mean A)(log p - mean log p)`` lies in
    ``[clip_cov_lb, clip_cov_ub]`` are candidates; ``clip_cov_ratio`` of all valid tokens are drawn
    uniformly from them and their gradient is cut (loss detached).  The rest use the PPO clipped
    surrogate.  Pass ``generator`` for a reproducible draw.
    """
    base = ppo_clip(log_probs, old_log_probs, advantages, response_mask, clip_ratio=clip_ratio)
    lp, _, adv, mask = _prep(log_probs, old_log_probs, advantages, response_mask)
    cov = _centered_cov(adv, lp, mask)
    cand = mask & (cov >= clip_cov_lb) & (cov <= clip_cov_ub)
    n_pick = int(clip_cov_ratio * float(mask.sum()))
    keys = torch.rand(cov.shape, generator=generator, device="cpu").to(cov.device)
    keys = torch.where(cand, keys, torch.full_like(keys, 2.0))
    picked = torch.zeros_like(mask)
    n_pick = min(n_pick, int(cand.sum()))
    if n_pick > 0:
        idx = keys.reshape(-1).topk(n_pick, largest=False).indices
        picked.view(-1)[idx] = True
    loss = torch.where(picked, base.loss_mat.detach(), base.loss_mat)
    stats = dict(base.stats)
    stats["cov_clip_frac"] = _frac(picked, mask)
    return _finish(loss, mask, is_weights, stats)


@register_policy_loss("kl_cov")
def kl_cov(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    kl_cov_ratio: float = 2e-3,
    ppo_kl_coef: float = 1.0,
    is_weights: Tensor | None = None,
) -> PolicyLossOutput:
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617).

    Unclipped surrogate ``-A r`` everywhere; on the top ``kl_cov_ratio`` fraction of valid tokens by
    centred covariance ``(A - mean A)(log p - mean log p)`` add ``ppo_kl_coef * |log r|``.
    """
    lp, log_ratio, adv, mask = _prep(log_probs, old_log_probs, advantages, response_mask)
    ratio = log_ratio.exp()
    loss = -adv * ratio
    cov = torch.where(mask, _centered_cov(adv, lp, mask), torch.full_like(lp, float("-inf")))
    k = int(kl_cov_ratio * float(mask.sum()))
    picked = torch.zeros_like(mask)
    if k > 0:
        picked.view(-1)[cov.reshape(-1).topk(k).indices] = True
    loss = torch.where(picked, loss + ppo_kl_coef * log_ratio.abs(), loss)
    stats = _base_stats(log_ratio, mask)
    stats["kl_cov_frac"] = _frac(picked, mask)
    return _finish(loss, mask, is_weights, stats)


@register_policy_loss("sapo")
def sapo(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    is_weights: Tensor | None = None,
) -> PolicyLossOutput:
    """SAPO, soft adaptive policy optimisation (Gao et al. 2025, arXiv:2511.20347).

    Hard clipping replaced by a soft gate ``f(r) = (4 / tau) * sigmoid(tau (r - 1))`` with
    ``tau = tau_pos`` for ``A > 0`` and ``tau_neg`` otherwise; ``L = -f(r) A``.  At ``r = 1`` the
    gradient equals the on-policy policy gradient.
    """
    _, log_ratio, adv, mask = _prep(log_probs, old_log_probs, advantages, response_mask)
    ratio = log_ratio.exp()
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss = -gate * adv
    stats = _base_stats(log_ratio, mask)
    stats["gate_mean"] = masked_mean(gate.detach(), mask)
    return _finish(loss, mask, is_weights, stats)


@register_policy_loss("topr")
def topr(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    level: str = "token",
    is_weights: Tensor | None = None,
) -> PolicyLossOutput:
    """TOPR, tapered off-policy REINFORCE (Le Roux et al. 2025, arXiv:2503.14286).

    Positive advantages: plain SFT-like ``-A log pi`` (no IS); negative: the IS weight truncated to
    ``[0, 1]`` and detached, ``-sg(min(r, 1)) A log pi``.  ``level="sequence"`` uses the
    sequence ratio ``exp(sum_t log r_t)`` (the paper's trajectory form), ``"token"`` per token.
    """
    lp, log_ratio, adv, mask = _prep(log_probs, old_log_probs, advantages, response_mask)
    if level == "sequence":
        lr = (log_ratio * mask).sum(-1, keepdim=True).clamp(max=LOG_RATIO_CLAMP).expand_as(lp)
    elif level == "token":
        lr = log_ratio
    else:
        raise ValueError(f"topr level must be 'token' or 'sequence', got {level!r}")
    w = torch.where(adv >= 0, torch.ones_like(lr), lr.exp().clamp(max=1.0)).detach()
    loss = -w * adv * lp
    stats = _base_stats(log_ratio, mask)
    stats["neg_weight_mean"] = masked_mean(w, mask & (adv < 0))
    return _finish(loss, mask, is_weights, stats)


@register_policy_loss("reinforce")
def reinforce(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    is_weights: Tensor | None = None,
) -> PolicyLossOutput:
    """Vanilla policy gradient (Williams 1992): ``L = -A * log pi``; ``old_log_probs`` is used
    only for the stats."""
    lp, log_ratio, adv, mask = _prep(log_probs, old_log_probs, advantages, response_mask)
    return _finish(-adv * lp, mask, is_weights, _base_stats(log_ratio, mask))


# --------------------------------------------------------------------------- value / KL / SFT


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    *,
    clip_range_value: float | None = 0.2,
) -> ValueLossOutput:
    """Clipped value loss (PPO2 baselines; Schulman et al. 2017).

    ``v_clip = old + clip(v - old, -c, c)``;
    ``L = 0.5 * max((v - R)^2, (v_clip - R)^2)`` (``c = None``: unclipped ``0.5 (v - R)^2``).

    Args:
        values, old_values, returns, response_mask: ``[B, T]``.
    Returns:
        ``ValueLossOutput`` with stats ``vf_clip_frac``, ``vpred_mean``.
    """
    for name, t in (
        ("old_values", old_values),
        ("returns", returns),
        ("response_mask", response_mask),
    ):
        if t.shape != values.shape:
            raise ValueError(f"{name} {tuple(t.shape)} != values {tuple(values.shape)}")
    mask = response_mask.bool()
    dt = torch.promote_types(values.dtype, torch.float32)
    v, ret = values.to(dt), returns.to(dt).detach()
    l1 = (v - ret) ** 2
    if clip_range_value is None:
        loss, frac = 0.5 * l1, torch.zeros((), device=v.device)
    else:
        old = old_values.to(dt).detach()
        v_clip = old + (v - old).clamp(-clip_range_value, clip_range_value)
        l2 = (v_clip - ret) ** 2
        loss, frac = 0.5 * torch.maximum(l1, l2), _frac(l2 > l1, mask)
    loss = torch.where(mask, loss, torch.zeros((), dtype=dt, device=v.device))
    stats = {"vf_clip_frac": frac.detach(), "vpred_mean": masked_mean(v.detach(), mask)}
    return ValueLossOutput(loss, mask, stats)


def _kl_k1(log_ratio: Tensor) -> Tensor:
    return log_ratio


def _kl_abs(log_ratio: Tensor) -> Tensor:
    return log_ratio.abs()


def _kl_k2(log_ratio: Tensor) -> Tensor:
    return 0.5 * log_ratio.square()


def _kl_k3(log_ratio: Tensor) -> Tensor:
    neg = (-log_ratio).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # log(ref / pi)
    return (neg.exp() - neg - 1.0).clamp(-10.0, 10.0)


_KL_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {
    "k1": _kl_k1,
    "kl": _kl_k1,
    "abs": _kl_abs,
    "k2": _kl_k2,
    "mse": _kl_k2,
    "k3": _kl_k3,
    "low_var_kl": _kl_k3,
}


def get_kl_estimator(name: str) -> Callable[[Tensor], Tensor]:
    """Per-token KL estimator of ``log_ratio = log pi - log ref`` by name (Schulman 2020,
    "Approximating KL divergence"): ``k1``/``kl`` = ``log r``; ``abs``; ``k2``/``mse`` =
    ``0.5 log^2 r``; ``k3``/``low_var_kl`` = ``ref/pi - log(ref/pi) - 1`` (clamped to [-10, 10])."""
    try:
        return _KL_ESTIMATORS[name]
    except KeyError:
        raise KeyError(
            f"unknown KL estimator {name!r}; known: {[*sorted(_KL_ESTIMATORS), 'full']}"
        ) from None


def kl_penalty(
    log_probs: Tensor,
    ref_log_probs: Tensor,
    kind: str = "k3",
    *,
    logits: Tensor | None = None,
    ref_logits: Tensor | None = None,
    chunk_size: int = 1024,
) -> Tensor:
    """Per-token KL(pi || ref) penalty ``[B, T]``, computed in float32.

    Args:
        log_probs, ref_log_probs: ``[B, T]`` (``log_ratio`` is clamped to ±20).
        kind: ``k1``/``kl``, ``abs``, ``k2``/``mse``, ``k3``/``low_var_kl`` or ``full``.
        logits, ref_logits: ``[B, T, V]`` for ``full`` — the distributions that produced each
            token (aligned with ``log_probs``); the exact ``sum_v p (log p - log q)`` is computed
            ``chunk_size`` rows at a time (differentiable w.r.t. ``logits``).
    Returns:
        ``[B, T]`` float32 (not masked; multiply by the response mask or aggregate).
    """
    if kind == "full":
        if logits is None or ref_logits is None:
            raise ValueError("kl_penalty(kind='full') needs logits and ref_logits [B, T, V]")
        if logits.shape != ref_logits.shape or logits.shape[:-1] != log_probs.shape:
            raise ValueError(
                f"logits {tuple(logits.shape)} / ref_logits {tuple(ref_logits.shape)} must be "
                f"[B, T, V] matching log_probs {tuple(log_probs.shape)}"
            )
        flat, rflat = logits.reshape(-1, logits.shape[-1]), ref_logits.reshape(-1, logits.shape[-1])
        parts = []
        for s in range(0, flat.shape[0], chunk_size):
            lp = F.log_softmax(_f32(flat[s : s + chunk_size]), -1)
            lq = F.log_softmax(_f32(rflat[s : s + chunk_size]).detach(), -1)
            parts.append((lp.exp() * (lp - lq)).sum(-1))
        return torch.cat(parts).reshape(log_probs.shape)
    if ref_log_probs.shape != log_probs.shape:
        raise ValueError(
            f"ref_log_probs {tuple(ref_log_probs.shape)} != log_probs {tuple(log_probs.shape)}"
        )
    dt = torch.promote_types(log_probs.dtype, torch.float32)
    log_ratio = (log_probs.to(dt) - ref_log_probs.to(dt).detach()).clamp(
        -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP
    )
    return get_kl_estimator(kind)(log_ratio)


def sft_loss(log_probs: Tensor, response_mask: Tensor) -> PolicyLossOutput:
    """Supervised fine-tuning negative log-likelihood: ``loss_mat = -log_probs`` on the mask.

    Args:
        log_probs: ``[B, T]``; response_mask: ``[B, T]`` (tokens to imitate).
    Returns:
        ``PolicyLossOutput`` (``out.loss("token-mean")`` is the usual token-mean NLL), stats ``nll``.
    """
    if response_mask.shape != log_probs.shape:
        raise ValueError(
            f"response_mask {tuple(response_mask.shape)} != log_probs {tuple(log_probs.shape)}"
        )
    mask = response_mask.bool()
    lp = log_probs.to(torch.promote_types(log_probs.dtype, torch.float32))
    loss = torch.where(mask, -lp, torch.zeros((), dtype=lp.dtype, device=lp.device))
    return PolicyLossOutput(loss, mask, {"nll": masked_mean(loss.detach(), mask)})


# --------------------------------------------------------------------------- preference losses


def _f32(x: Tensor) -> Tensor:
    """Promote to at least float32 (float64 stays float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _check_same(*named: tuple[str, Tensor]) -> None:
    shape = named[0][1].shape
    if len(shape) != 1:
        raise ValueError(f"{named[0][0]} must be [B], got {tuple(shape)}")
    for name, t in named[1:]:
        if t.shape != shape:
            raise ValueError(f"{name} {tuple(t.shape)} != {named[0][0]} {tuple(shape)}")


#: reward differences this small are ties: a policy equal to its reference, its log-probs
#: computed in another layout (sharded ranks, another batch), differs from it by float noise
TIE_ATOL = 1e-5


def pair_ties(chosen: Tensor, rejected: Tensor, atol: float = TIE_ATOL) -> Tensor:
    """Per pair [B]: 1 where the two rewards differ by at most ``atol``, else 0."""
    return ((chosen - rejected).abs() <= atol).float()


def pair_accuracy(chosen: Tensor, rejected: Tensor, atol: float = TIE_ATOL) -> Tensor:
    """Per pair [B]: 1 where the chosen reward is higher, 0.5 on a tie (within ``atol``), 0
    otherwise. Counting a tie as a coin flip keeps a policy equal to its reference (every pair
    tied) at 0.5, not 0."""
    tie = pair_ties(chosen, rejected, atol)
    return (chosen > rejected).float() * (1 - tie) + 0.5 * tie


def _pair_stats(chosen: Tensor, rejected: Tensor) -> dict[str, Tensor]:
    c, r = chosen.detach(), rejected.detach()
    return {
        "reward_accuracy": pair_accuracy(c, r).mean(),
        "reward_ties": pair_ties(c, r).mean(),
        "reward_margin": (c - r).mean(),
    }


def dpo(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> PreferenceLossOutput:
    """DPO (Rafailov et al. 2023, arXiv:2305.18290), sigmoid loss; conservative DPO (cDPO,
    Mitchell 2023) with ``label_smoothing = eps``.

    ``h = beta * ((pi_c - ref_c) - (pi_r - ref_r))``;
    ``L = -(1 - eps) log sigmoid(h) - eps log sigmoid(-h)``.

    Args:
        all inputs ``[B]`` summed sequence log-probs.
    Returns:
        ``PreferenceLossOutput``; rewards are ``beta * (pi - ref)``.
    """
    _check_same(
        ("policy_chosen_logps", policy_chosen_logps),
        ("policy_rejected_logps", policy_rejected_logps),
        ("ref_chosen_logps", ref_chosen_logps),
        ("ref_rejected_logps", ref_rejected_logps),
    )
    c = _f32(policy_chosen_logps) - _f32(ref_chosen_logps).detach()
    r = _f32(policy_rejected_logps) - _f32(ref_rejected_logps).detach()
    h = beta * (c - r)
    losses = -(1.0 - label_smoothing) * F.logsigmoid(h) - label_smoothing * F.logsigmoid(-h)
    cr, rr = beta * c.detach(), beta * r.detach()
    return PreferenceLossOutput(losses, cr, rr, _pair_stats(cr, rr))


def ipo(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float = 0.1,
) -> PreferenceLossOutput:
    """IPO (Azar et al. 2023, arXiv:2310.12036): ``L = (h - 1/(2 beta))^2`` with
    ``h = (pi_c - ref_c) - (pi_r - ref_r)`` (pass length-averaged log-probs to follow the paper).

    Args:
        all inputs ``[B]``.
    """
    _check_same(
        ("policy_chosen_logps", policy_chosen_logps),
        ("policy_rejected_logps", policy_rejected_logps),
        ("ref_chosen_logps", ref_chosen_logps),
        ("ref_rejected_logps", ref_rejected_logps),
    )
    c = _f32(policy_chosen_logps) - _f32(ref_chosen_logps).detach()
    r = _f32(policy_rejected_logps) - _f32(ref_rejected_logps).detach()
    losses = (c - r - 1.0 / (2.0 * beta)) ** 2
    cr, rr = beta * c.detach(), beta * r.detach()
    return PreferenceLossOutput(losses, cr, rr, _pair_stats(cr, rr))


def simpo(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    *,
    beta: float = 2.0,
    gamma: float = 0.5,
    label_smoothing: float = 0.0,
) -> PreferenceLossOutput:
    """SimPO (Meng et al. 2024, arXiv:2405.14734), reference-free:
    ``h = beta * (avg_c - avg_r) - gamma``; ``L = -(1-eps) log sigmoid(h) - eps log sigmoid(-h)``.

    Args:
        policy_chosen_logps, policy_rejected_logps: ``[B]`` *length-averaged* log-probs.
        gamma: target reward margin.
    """
    _check_same(
        ("policy_chosen_logps", policy_chosen_logps),
        ("policy_rejected_logps", policy_rejected_logps),
    )
    c, r = _f32(policy_chosen_logps), _f32(policy_rejected_logps)
    h = beta * (c - r) - gamma
    losses = -(1.0 - label_smoothing) * F.logsigmoid(h) - label_smoothing * F.logsigmoid(-h)
    cr, rr = beta * c.detach(), beta * r.detach()
    return PreferenceLossOutput(losses, cr, rr, _pair_stats(cr, rr))


def kto(
    policy_logps: Tensor,
    ref_logps: Tensor,
    desirable: Tensor,
    kl: Tensor | float,
    *,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> PreferenceLossOutput:
    """KTO (Ethayarajh et al. 2024, arXiv:2402.01306), unpaired.

    ``r = pi - ref``, ``z = max(kl, 0)`` (detached reference point, e.g. a mismatched-pair KL
    estimate); desirable: ``lambda_D (1 - sigmoid(beta (r - z)))``; undesirable:
    ``lambda_U (1 - sigmoid(beta (z - r)))``.

    Args:
        policy_logps, ref_logps: ``[B]`` summed log-probs.  desirable: ``[B]`` bool.
        kl: scalar reference point.
    Returns:
        ``PreferenceLossOutput``: ``losses [B]``; ``chosen_rewards`` holds ``beta r`` on desirable
        rows (0 elsewhere), ``rejected_rewards`` on undesirable rows.
    """
    _check_same(("policy_logps", policy_logps), ("ref_logps", ref_logps), ("desirable", desirable))
    r = _f32(policy_logps) - _f32(ref_logps).detach()
    z = torch.as_tensor(kl, dtype=r.dtype, device=r.device).detach().clamp(min=0.0)
    d = desirable.bool()
    pos = desirable_weight * (1.0 - torch.sigmoid(beta * (r - z)))
    neg = undesirable_weight * (1.0 - torch.sigmoid(beta * (z - r)))
    losses = torch.where(d, pos, neg)
    rew = beta * r.detach()
    cr, rr = torch.where(d, rew, torch.zeros_like(rew)), torch.where(d, torch.zeros_like(rew), rew)
    stats = {
        "desirable_reward_mean": masked_mean(rew, d),
        "undesirable_reward_mean": masked_mean(rew, ~d),
        "kl": z,
    }
    return PreferenceLossOutput(losses, cr, rr, stats)


def _log1mexp(x: Tensor) -> Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, stable (Mächler 2012)."""
    return torch.where(
        x > -0.6931471805599453, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x))
    )


def orpo(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    *,
    beta: float = 0.1,
) -> PreferenceLossOutput:
    """ORPO (Hong et al. 2024, arXiv:2403.07691), reference-free odds ratio.

    With length-averaged log-probs ``a``: ``log odds = a - log(1 - exp(a))``;
    ``L = -a_c - beta * log sigmoid(log odds_c - log odds_r)`` (SFT NLL plus odds-ratio term).

    Args:
        policy_chosen_logps, policy_rejected_logps: ``[B]`` length-averaged log-probs (< 0).
    """
    _check_same(
        ("policy_chosen_logps", policy_chosen_logps),
        ("policy_rejected_logps", policy_rejected_logps),
    )
    c = _f32(policy_chosen_logps).clamp(max=-1e-6)
    r = _f32(policy_rejected_logps).clamp(max=-1e-6)
    log_odds = (c - _log1mexp(c)) - (r - _log1mexp(r))
    ratio_term = F.logsigmoid(log_odds)
    losses = -c - beta * ratio_term
    cr, rr = beta * c.detach(), beta * r.detach()
    stats = _pair_stats(cr, rr)
    stats["log_odds_ratio"] = log_odds.detach().mean()
    stats["nll"] = (-c).detach().mean()
    return PreferenceLossOutput(losses, cr, rr, stats)
