"""Actor and critic losses built from rl_algos by config (ROLL's algorithm keys).

Each returned ``loss_fn(micro_batch, forward_output, ctx)`` aggregates with the mini-batch's GLOBAL
token / sequence counts (``ctx``), so gradient accumulation and data-parallel ranks add up to the
single-process full-batch loss. Metrics are token-weighted shares that add up the same way.

Actor config keys (all optional):
    pg_variant / policy_loss: name in rl_algos' policy-loss registry (default ``ppo``)
    loss_agg_mode: token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    pg_clip / clip_ratio, pg_clip_low, pg_clip_high, dual_clip_loss + clip_ratio_c
    policy_loss_kwargs: extra keyword arguments of the chosen policy loss
    use_kl_loss, kl_loss_coef, kl_loss_type (k1/kl, abs, k2/mse, k3/low_var_kl); a KL penalty in
        the REWARD (add_token_level_kl / init_kl_coef) is applied upstream to the rewards, not here
    entropy_loss_coef
    is_correction: {mode: none|truncated|masked, level: token|sequence|geometric, threshold,
        low, high} — train/inference mismatch correction against ``rollout_log_probs``
Critic config keys: value_clip / clip_range_value, critic_loss_agg_mode (default token-mean).
"""

from __future__ import annotations

from typing import Any

import torch

from rl_algos.aggregate import aggregate
from rl_algos.correction import masked_is, mismatch_metrics, truncated_is
from rl_algos.losses import get_policy_loss, kl_penalty, value_loss
from rl_train.args import as_mapping
from rl_train.types import Batch, ForwardOutput, LossContext, LossFn, LossResult


def _agg(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, ctx: LossContext) -> torch.Tensor:
    return aggregate(
        loss_mat,
        mask,
        mode,
        global_token_count=ctx.global_tokens,
        global_seq_count=ctx.global_seqs,
        norm_constant=float(ctx.max_seq_len),
    )


def _share(stat: torch.Tensor, mask: torch.Tensor, ctx: LossContext) -> torch.Tensor:
    """A micro-batch mean statistic weighted by its share of the mini-batch's tokens."""
    return stat.detach().float() * (mask.sum().float() / max(ctx.global_tokens, 1.0))


def _require(mb: Batch, key: str, role: str) -> torch.Tensor:
    if key not in mb:
        raise KeyError(f"{role} loss needs batch[{key!r}] ([B, T], aligned with input_ids)")
    return mb[key]


def build_actor_loss(cfg: Any = None) -> LossFn:
    c = as_mapping(cfg)
    name = c.get("pg_variant") or c.get("policy_loss") or "ppo"
    policy_loss = get_policy_loss(name)  # unknown name -> rl_algos' error lists the registry
    mode = c.get("loss_agg_mode", "token-mean")
    kwargs: dict[str, Any] = dict(c.get("policy_loss_kwargs") or {})
    if name in ("ppo", "ppo_clip"):
        clip = c.get("pg_clip", c.get("clip_ratio", 0.2))
        kwargs.setdefault("clip_ratio", clip)
        if c.get("pg_clip_low") is not None:
            kwargs.setdefault("clip_ratio_low", c["pg_clip_low"])
        if c.get("pg_clip_high") is not None:
            kwargs.setdefault("clip_ratio_high", c["pg_clip_high"])
        if c.get("dual_clip_loss"):
            kwargs.setdefault("clip_ratio_c", c.get("clip_ratio_c", 3.0))
    use_kl = bool(c.get("use_kl_loss", False))
    kl_coef = float(c.get("kl_loss_coef", 0.0))
    kl_kind = c.get("kl_loss_type", "k3")
    ent_coef = float(c.get("entropy_loss_coef", 0.0))
    is_cfg = dict(c.get("is_correction") or {})
    is_mode = is_cfg.pop("mode", "none")
    if is_mode not in ("none", "truncated", "masked"):
        raise ValueError(f"is_correction.mode={is_mode!r}; expected none, truncated or masked")

    def loss_fn(mb: Batch, out: ForwardOutput, ctx: LossContext) -> LossResult:
        if out.log_probs is None:
            raise ValueError("actor loss needs log_probs in the forward output")
        lp = out.log_probs
        mask = _require(mb, "response_mask", "actor").bool()
        old = mb.get("old_log_probs")
        old = lp.detach() if old is None else old
        adv = _require(mb, "advantages", "actor")
        metrics: dict[str, torch.Tensor] = {}
        is_weights = None
        if is_mode != "none":
            rollout = _require(mb, "rollout_log_probs", "actor (is_correction)")
            corr = (truncated_is if is_mode == "truncated" else masked_is)(
                old, rollout, mask, **is_cfg
            )
            is_weights, mask = corr.weights, corr.mask
            for k, v in {
                **corr.stats,
                **mismatch_metrics(old, rollout, mb["response_mask"].bool()),
            }.items():
                if "max" in k or "min" in k:
                    continue  # not additive over micro-batches
                metrics[k] = _share(v, mb["response_mask"], ctx)
        if is_weights is not None:
            result = policy_loss(lp, old, adv, mask, is_weights=is_weights, **kwargs)
        else:
            result = policy_loss(lp, old, adv, mask, **kwargs)
        loss = _agg(result.loss_mat, result.mask, mode, ctx)
        metrics["pg_loss"] = loss.detach()
        for k, v in result.stats.items():
            if v.dim() == 0 and "max" not in k and "min" not in k:
                metrics[k] = _share(v, mask, ctx)
        if use_kl:
            ref = _require(mb, "ref_log_probs", "actor (use_kl_loss)")
            kl = _agg(kl_penalty(lp, ref, kl_kind), mask, mode, ctx)
            loss = loss + kl_coef * kl
            metrics["kl_loss"] = kl.detach()
        if out.entropy is not None:
            ent = _agg(out.entropy, mask, mode, ctx)
            if ent_coef:
                loss = loss - ent_coef * ent
            metrics["entropy"] = ent.detach()
        return loss, metrics

    return loss_fn


def build_critic_loss(cfg: Any = None) -> LossFn:
    c = as_mapping(cfg)
    clip = c.get("value_clip", c.get("clip_range_value", 0.5))
    mode = c.get("critic_loss_agg_mode", "token-mean")

    def loss_fn(mb: Batch, out: ForwardOutput, ctx: LossContext) -> LossResult:
        if out.values is None:
            raise ValueError("critic loss needs values in the forward output")
        mask = _require(mb, "response_mask", "critic").bool()
        returns = _require(mb, "returns", "critic")
        old = mb.get("values")
        old = out.values.detach() if old is None else old
        result = value_loss(out.values, old, returns, mask, clip_range_value=clip)
        loss = _agg(result.loss_mat, result.mask, mode, ctx)
        metrics = {"vf_loss": loss.detach()}
        metrics.update({k: _share(v, mask, ctx) for k, v in result.stats.items()})
        return loss, metrics

    return loss_fn
