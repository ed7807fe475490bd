"""Actor and critic losses built from rl_algos by typed configs.

Each returned ``loss_fn(micro_batch, forward_output, ctx)`` aggregates with the mini-batch's GLOBAL
token / sequence counts (``ctx``), so gradient accumulation and data-parallel ranks add up to the
single-process full-batch loss. Metrics are token-weighted shares that add up the same way.

The configs are frozen dataclasses (they cross process boundaries); rl_runtime.compose builds them
from an experiment config (ROLL's key names and aliases are resolved there, not here).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from rl_algos.aggregate import aggregate
from rl_algos.correction import masked_is, mismatch_metrics, truncated_is
from rl_algos.losses import get_policy_loss, kl_penalty, value_loss
from rl_train.args import LogprobSampling
from rl_train.types import Batch, ForwardOutput, LossContext, LossFn, LossResult

ISLevel = Literal["token", "sequence", "geometric"]


@dataclass(frozen=True)
class ISWeightConfig:
    """Truncated importance weights ``min(pi_train / pi_rollout, upper_bound)`` on the loss."""

    level: ISLevel = "token"
    upper_bound: float = math.inf


@dataclass(frozen=True)
class ISFilterConfig:
    """Mask tokens (or sequences) whose ratio ``pi_train / pi_rollout`` is outside [low, high]."""

    level: ISLevel = "token"
    low: float = 0.8
    high: float = 1.2


CLIP_RANGE_OPTION = "clip_ratio_low/clip_ratio_high"
DUAL_CLIP_OPTION = "dual_clip_c"


def policy_loss_keywords(policy_loss: str) -> frozenset[str]:
    """The keyword options the registered policy loss ``policy_loss`` accepts (its signature)."""
    params = inspect.signature(get_policy_loss(policy_loss)).parameters.values()
    return frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def clip_kwargs(
    policy_loss: str,
    clip_ratio_low: float | None,
    clip_ratio_high: float | None,
    dual_clip_c: float | None,
) -> tuple[dict[str, float], dict[str, str]]:
    """``(keyword arguments, {option: why it cannot be read})`` of the clip options for
    ``policy_loss``, decided by its signature: a range goes to ``clip_ratio_low/high``, or to a
    single ``clip_ratio`` when the two are equal; ``dual_clip_c`` to ``clip_ratio_c``. None: not
    given (the loss keeps its own published default, e.g. gspo's 3e-4/4e-4)."""
    accepted = policy_loss_keywords(policy_loss)
    kwargs: dict[str, float] = {}
    unread: dict[str, str] = {}
    given = {
        k: v
        for k, v in (("clip_ratio_low", clip_ratio_low), ("clip_ratio_high", clip_ratio_high))
        if v is not None
    }
    if given and set(given) <= accepted:
        kwargs.update(given)
    elif given and "clip_ratio" in accepted:
        if len(given) == 2 and clip_ratio_low == clip_ratio_high:
            kwargs["clip_ratio"] = float(given["clip_ratio_low"])
        else:
            unread[CLIP_RANGE_OPTION] = (
                f"policy loss {policy_loss!r} takes one symmetric clip_ratio, got "
                f"low={clip_ratio_low} high={clip_ratio_high}"
            )
    elif given:
        unread[CLIP_RANGE_OPTION] = f"policy loss {policy_loss!r} has no clip range"
    if dual_clip_c is not None:
        if "clip_ratio_c" in accepted:
            kwargs["clip_ratio_c"] = dual_clip_c
        else:
            unread[DUAL_CLIP_OPTION] = f"policy loss {policy_loss!r} has no dual clip"
    return kwargs, unread


@dataclass(frozen=True)
class ActorLossConfig:
    """The actor's loss: a policy loss from rl_algos' registry plus KL / entropy / IS terms.

    ``clip_ratio_low/high``: clip epsilons (ratio clipped to [1-low, 1+high]), passed to every loss
    whose signature takes them (to a single ``clip_ratio`` when equal, e.g. clip_cov); None: the
    loss's own published default (ppo 0.2, gspo 3e-4/4e-4, cispo 1.0/0.28, gmpo 0.4).
    ``dual_clip_c``: dual-clip constant (None: off). A clip option the chosen loss cannot read is a
    ``ValueError`` naming it (see :func:`clip_kwargs`).
    ``norm_constant``: denominator of ``seq-mean-token-sum-norm`` (Dr.GRPO's fixed generation
    budget, MAX_TOKENS); rl_runtime.compose fills it from the configured response budget. None
    (library use, nothing configures it): the mini-batch's padded width ``T``, which is NOT
    constant (it grows with the longest prompt of the batch) — set it for Dr.GRPO's scale.
    ``is_weight``/``is_filters``: train/inference mismatch correction against
    ``batch["rollout_log_probs"]`` (weights, then masks in order).
    """

    policy_loss: str = "ppo_clip"
    loss_agg_mode: str = "token-mean"
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    dual_clip_c: float | None = None
    norm_constant: float | None = None
    policy_loss_kwargs: tuple[tuple[str, Any], ...] = ()
    rl_loss_coef: float = 1.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "k3"
    entropy_loss_coef: float = 0.0
    is_weight: ISWeightConfig | None = None
    is_filters: tuple[ISFilterConfig, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        get_policy_loss(self.policy_loss)  # unknown name -> rl_algos' error lists the registry
        if self.dual_clip_c is not None and self.dual_clip_c <= 1.0:
            raise ValueError(f"dual_clip_c must be > 1, got {self.dual_clip_c}")
        _check_norm_constant(self.norm_constant)
        self.policy_kwargs()  # a clip option the loss cannot read fails here

    def policy_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the chosen policy loss."""
        clip, unread = clip_kwargs(
            self.policy_loss, self.clip_ratio_low, self.clip_ratio_high, self.dual_clip_c
        )
        if unread:
            raise ValueError(
                "; ".join(f"ActorLossConfig.{key}: {why}" for key, why in unread.items())
            )
        return {**dict(self.policy_loss_kwargs), **clip}


@dataclass(frozen=True)
class CriticLossConfig:
    """The critic's clipped value loss: ``value_clip`` (None: unclipped), aggregation mode, and
    ``norm_constant`` of ``seq-mean-token-sum-norm`` (as in :class:`ActorLossConfig`)."""

    value_clip: float | None = None
    loss_agg_mode: str = "token-mean"
    norm_constant: float | None = None

    def __post_init__(self) -> None:
        _check_norm_constant(self.norm_constant)


def _check_norm_constant(value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"norm_constant must be > 0, got {value}")


def _agg(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    ctx: LossContext,
    norm_constant: float | None,
) -> torch.Tensor:
    """``[B, T]`` -> scalar; ``seq-mean-token-sum-norm`` divides by ``norm_constant`` (None: the
    mini-batch's padded width ``ctx.max_seq_len``, the library fallback)."""
    return aggregate(
        loss_mat,
        mask,
        mode,
        global_token_count=ctx.global_tokens,
        global_seq_count=ctx.global_seqs,
        norm_constant=float(ctx.max_seq_len) if norm_constant is None else norm_constant,
    )


def _share(stat: torch.Tensor, mask: torch.Tensor, ctx: LossContext) -> torch.Tensor:
    """A micro-batch mean statistic weighted by its share of the mini-batch's tokens."""
    return stat.detach().float() * (mask.sum().float() / max(ctx.global_tokens, 1.0))


def _require(mb: Batch, key: str, role: str) -> torch.Tensor:
    if key not in mb:
        raise KeyError(f"{role} loss needs batch[{key!r}] ([B, T], aligned with input_ids)")
    return mb[key]


def build_actor_loss(cfg: ActorLossConfig | None = None) -> LossFn:
    c = cfg or ActorLossConfig()
    if not isinstance(c, ActorLossConfig):
        raise TypeError(f"build_actor_loss takes an ActorLossConfig, got {type(c).__name__}")
    policy_loss = get_policy_loss(c.policy_loss)
    mode, norm = c.loss_agg_mode, c.norm_constant
    kwargs = c.policy_kwargs()

    def loss_fn(mb: Batch, out: ForwardOutput, ctx: LossContext) -> LossResult:
        if out.log_probs is None:
            raise ValueError("actor loss needs log_probs in the forward output")
        lp = out.log_probs
        mask = _require(mb, "response_mask", "actor").bool()
        old = mb.get("old_log_probs")
        old = lp.detach() if old is None else old
        adv = _require(mb, "advantages", "actor")
        metrics: dict[str, torch.Tensor] = {}
        is_weights, mask = _is_correction(c, mb, old, mask, metrics, ctx)
        if "rollout_log_probs" in mb:  # train/inference mismatch, against the trainer's old policy
            mismatch = mismatch_metrics(old, mb["rollout_log_probs"], mb["response_mask"].bool())
            _add_shares(metrics, mismatch, mb["response_mask"], ctx)
        if is_weights is not None:
            result = policy_loss(lp, old, adv, mask, is_weights=is_weights, **kwargs)
        else:
            result = policy_loss(lp, old, adv, mask, **kwargs)
        loss = _agg(result.loss_mat, result.mask, mode, ctx, norm)
        metrics["pg_loss"] = loss.detach()
        loss = c.rl_loss_coef * loss
        for k, v in result.stats.items():
            if v.dim() == 0 and "max" not in k and "min" not in k:
                metrics[k] = _share(v, mask, ctx)
        if c.use_kl_loss:
            ref = _require(mb, "ref_log_probs", "actor (use_kl_loss)")
            kl = _agg(kl_penalty(lp, ref, c.kl_loss_type), mask, mode, ctx, norm)
            loss = loss + c.kl_loss_coef * kl
            metrics["kl_loss"] = kl.detach()
        if out.entropy is not None:
            ent = _agg(out.entropy, mask, mode, ctx, norm)
            if c.entropy_loss_coef:
                loss = loss - c.entropy_loss_coef * ent
            metrics["entropy"] = ent.detach()
        return loss, metrics

    setattr(loss_fn, "reads_old_log_probs", True)  # noqa: B010 (see reads_old_log_probs)
    return loss_fn


def forward_sampling(loss_fn: LossFn | None, default: LogprobSampling) -> LogprobSampling:
    """The distribution of the log-probs ``loss_fn`` reads: its ``logprob_sampling`` attribute
    where it has one (a supervised loss: ``LogprobSampling()``, the model's own full distribution
    fitted to data), else ``default`` (``TrainingArgs.logprob_sampling``, the policy's sampling
    distribution)."""
    declared = getattr(loss_fn, "logprob_sampling", default)
    if not isinstance(declared, LogprobSampling):
        raise TypeError(
            f"{getattr(loss_fn, '__name__', loss_fn)!r}.logprob_sampling must be a "
            f"LogprobSampling, got {type(declared).__name__}"
        )
    return declared


def reads_old_log_probs(loss_fn: LossFn | None) -> bool:
    """Whether ``loss_fn`` is a policy loss built by :func:`build_actor_loss`: it reads
    ``old_log_probs`` (the detached current log-probs where the batch has none)."""
    return bool(getattr(loss_fn, "reads_old_log_probs", False))


def _is_correction(
    c: ActorLossConfig,
    mb: Batch,
    old: torch.Tensor,
    mask: torch.Tensor,
    metrics: dict[str, torch.Tensor],
    ctx: LossContext,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """IS weights (or None) and the filtered mask; adds the additive correction metrics."""
    if c.is_weight is None and not c.is_filters:
        return None, mask
    rollout = _require(mb, "rollout_log_probs", "actor (train_infer_correction)")
    weights = None
    stats: dict[str, torch.Tensor] = {}
    if c.is_weight is not None:
        corr = truncated_is(
            old, rollout, mask, level=c.is_weight.level, threshold=c.is_weight.upper_bound
        )
        weights = corr.weights
        stats.update(corr.stats)
    for f in c.is_filters:
        corr = masked_is(old, rollout, mask, level=f.level, low=f.low, high=f.high)
        mask = corr.mask
        stats.update(corr.stats)
    if weights is not None:
        weights = torch.where(mask, weights, torch.zeros_like(weights))
    _add_shares(metrics, stats, mb["response_mask"], ctx)
    return weights, mask


def _add_shares(
    metrics: dict[str, torch.Tensor],
    stats: dict[str, torch.Tensor],
    mask: torch.Tensor,
    ctx: LossContext,
) -> None:
    """Add the micro-batch's share of each additive statistic (max/min are not additive)."""
    for k, v in stats.items():
        if "max" not in k and "min" not in k:
            metrics[k] = _share(v, mask, ctx)


def build_critic_loss(cfg: CriticLossConfig | None = None) -> LossFn:
    c = cfg or CriticLossConfig()
    if not isinstance(c, CriticLossConfig):
        raise TypeError(f"build_critic_loss takes a CriticLossConfig, got {type(c).__name__}")
    clip, mode, norm = c.value_clip, c.loss_agg_mode, c.norm_constant

    def loss_fn(mb: Batch, out: ForwardOutput, ctx: LossContext) -> LossResult:
        if out.values is None:
            raise ValueError("critic loss needs values in the forward output")
        mask = _require(mb, "response_mask", "critic").bool()
        returns = _require(mb, "returns", "critic")
        old = mb.get("values")
        old = out.values.detach() if old is None else old
        result = value_loss(out.values, old, returns, mask, clip_range_value=clip)
        loss = _agg(result.loss_mat, result.mask, mode, ctx, norm)
        metrics = {"vf_loss": loss.detach()}
        metrics.update({k: _share(v, mask, ctx) for k, v in result.stats.items()})
        return loss, metrics

    return loss_fn
