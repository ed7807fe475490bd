"""rl_train.losses: Dr.GRPO's constant normaliser and clip options per policy loss."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from rl_algos.losses import get_policy_loss, list_policy_losses
from rl_train.losses import (
    ActorLossConfig,
    CriticLossConfig,
    build_actor_loss,
    build_critic_loss,
    clip_kwargs,
)
from rl_train.types import ForwardOutput, LossContext

NORM = "seq-mean-token-sum-norm"


def _padded(prompt_len: int, response_len: int = 4, rows: int = 2):
    """``rows`` responses of ``response_len`` tokens after a ``prompt_len`` prompt: ``[B, T]``
    mask and the LossContext rl_train.core builds (``max_seq_len`` = the padded width T)."""
    width = prompt_len + response_len
    mask = torch.zeros(rows, width, dtype=torch.bool)
    mask[:, prompt_len:] = True
    ctx = LossContext(global_tokens=float(mask.sum()), global_seqs=float(rows), max_seq_len=width)
    return mask, ctx


def _actor_grad(cfg: ActorLossConfig, prompt_len: int) -> torch.Tensor:
    """dL/dlog_probs on the response tokens ([B * 4]) for advantage 1 at ratio 1."""
    mask, ctx = _padded(prompt_len)
    lp = torch.zeros(mask.shape, requires_grad=True)
    batch = {
        "response_mask": mask,
        "old_log_probs": torch.zeros(mask.shape),
        "advantages": torch.ones(mask.shape),
    }
    loss, _ = build_actor_loss(cfg)(batch, ForwardOutput(log_probs=lp), ctx)
    loss.backward()
    assert lp.grad is not None
    return lp.grad[mask]


def test_norm_constant_makes_the_gradient_independent_of_the_prompt_length():
    cfg = ActorLossConfig(loss_agg_mode=NORM, norm_constant=8.0)
    short, long = _actor_grad(cfg, prompt_len=4), _actor_grad(cfg, prompt_len=60)
    # L = mean_b sum_t (-A r_t) / 8, r = exp(lp - old): dL/dlp = -1 / (2 rows * 8) per token
    assert torch.equal(short, long)
    assert short.tolist() == pytest.approx([-0.0625] * 8)


def test_without_norm_constant_the_padded_width_divides():
    # library use, nothing configures the constant: T = prompt + response (documented fallback)
    cfg = ActorLossConfig(loss_agg_mode=NORM)
    assert _actor_grad(cfg, prompt_len=4).tolist() == pytest.approx([-1 / (2 * 8)] * 8)
    assert _actor_grad(cfg, prompt_len=60).tolist() == pytest.approx([-1 / (2 * 64)] * 8)


def test_critic_norm_constant_makes_the_gradient_independent_of_the_prompt_length():
    def grad(prompt_len: int) -> torch.Tensor:
        mask, ctx = _padded(prompt_len)
        values = torch.zeros(mask.shape, requires_grad=True)
        batch = {"response_mask": mask, "returns": torch.ones(mask.shape)}
        cfg = CriticLossConfig(loss_agg_mode=NORM, norm_constant=8.0)
        loss, _ = build_critic_loss(cfg)(batch, ForwardOutput(values=values), ctx)
        loss.backward()
        assert values.grad is not None
        return values.grad[mask]

    # L = mean_b sum_t 0.5 (v - R)^2 / 8: dL/dv = (v - R) / (2 * 8) = -0.0625
    assert grad(4).tolist() == grad(60).tolist() == pytest.approx([-0.0625] * 8)


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_norm_constant_must_be_positive(bad):
    with pytest.raises(ValueError, match="norm_constant"):
        ActorLossConfig(loss_agg_mode=NORM, norm_constant=bad)
    with pytest.raises(ValueError, match="norm_constant"):
        CriticLossConfig(loss_agg_mode=NORM, norm_constant=bad)


def _one_token_loss(cfg: ActorLossConfig, ratio: float, adv: float) -> float:
    old = torch.zeros(1, 1)
    batch = {
        "response_mask": torch.ones(1, 1, dtype=torch.bool),
        "old_log_probs": old,
        "advantages": torch.full((1, 1), adv),
    }
    ctx = LossContext(global_tokens=1, global_seqs=1, max_seq_len=1)
    out = ForwardOutput(log_probs=old + math.log(ratio))
    return float(build_actor_loss(cfg)(batch, out, ctx)[0])


# ratio 1.5, advantage +1, upper epsilon 0.28: gspo -1.28 (clipped ratio); cispo -1.28 * log 1.5
# (clipped detached weight times log-prob); gmpo -exp(0.28) (clipped in log space)
CLIPPED_AT_028 = {"gspo": -1.28, "cispo": -1.28 * math.log(1.5), "gmpo": -math.exp(0.28)}


@pytest.mark.parametrize("name", sorted(CLIPPED_AT_028))
def test_clip_range_reaches_every_loss_with_a_range(name):
    # old code: each loss ran with its own default (gspo 4e-4, cispo 0.28, gmpo 0.4)
    cfg = ActorLossConfig(policy_loss=name, clip_ratio_low=0.1, clip_ratio_high=0.28)
    assert cfg.policy_kwargs() == {"clip_ratio_low": 0.1, "clip_ratio_high": 0.28}
    assert _one_token_loss(cfg, 1.5, 1.0) == pytest.approx(CLIPPED_AT_028[name])


def test_unset_clip_keeps_each_loss_its_published_default():
    assert ActorLossConfig(policy_loss="gspo").policy_kwargs() == {}
    # gspo's own 4e-4: ratio 1.2 with advantage +1 is clipped at 1.0004
    assert _one_token_loss(ActorLossConfig(policy_loss="gspo"), 1.2, 1.0) == pytest.approx(-1.0004)
    assert _one_token_loss(ActorLossConfig(), 1.5, 1.0) == pytest.approx(-1.2)  # ppo's 0.2


def test_symmetric_range_maps_to_clip_ratio_and_asymmetric_is_refused():
    cfg = ActorLossConfig(policy_loss="clip_cov", clip_ratio_low=0.1, clip_ratio_high=0.1)
    assert cfg.policy_kwargs() == {"clip_ratio": 0.1}
    assert _one_token_loss(cfg, 1.5, 1.0) == pytest.approx(-1.1)  # old code: clip_ratio 0.2
    with pytest.raises(ValueError, match="clip_ratio_low/clip_ratio_high.*symmetric"):
        ActorLossConfig(policy_loss="clip_cov", clip_ratio_low=0.1, clip_ratio_high=0.28)


@pytest.mark.parametrize("name", ["gspo", "cispo", "gmpo", "clip_cov", "reinforce", "sapo"])
def test_dual_clip_is_refused_where_the_loss_has_none(name):
    with pytest.raises(ValueError, match="dual_clip_c"):
        ActorLossConfig(policy_loss=name, dual_clip_c=3.0)


@pytest.mark.parametrize("name", list_policy_losses())
def test_every_clip_option_is_passed_or_refused_by_the_signature(name):
    params = inspect.signature(get_policy_loss(name)).parameters
    kwargs, unread = clip_kwargs(name, 0.25, 0.25, 3.0)
    assert set(kwargs) <= set(params)
    ranged = {"clip_ratio_low", "clip_ratio_high", "clip_ratio"} & set(params)
    assert bool(ranged) == ("clip_ratio_low/clip_ratio_high" not in unread)
    assert ("clip_ratio_c" in params) == ("dual_clip_c" not in unread)
