"""Losses: hand-derived values, float64 gradcheck for every loss, registry, typed results."""

from __future__ import annotations

import math

import pytest
import torch

from rl_algos import losses as L
from rl_algos.losses import get_policy_loss, kl_penalty

LN = math.log


def one(lp, old, adv, fn, **kw):
    t = lambda x: torch.tensor([[x]], dtype=torch.float64)  # noqa: E731
    return fn(t(lp), t(old), t(adv), torch.ones(1, 1, dtype=torch.bool), **kw).loss_mat.item()


def test_ppo_clip_hand_values() -> None:
    assert one(LN(1.5), 0.0, 1.0, L.ppo_clip) == pytest.approx(-1.2)
    assert one(LN(0.5), 0.0, -1.0, L.ppo_clip) == pytest.approx(0.8)
    assert one(LN(1.1), 0.0, 1.0, L.ppo_clip) == pytest.approx(-1.1)  # inside the band
    # clip-higher: upper bound 1.28
    assert one(
        LN(1.5), 0.0, 1.0, L.ppo_clip, clip_ratio_low=0.2, clip_ratio_high=0.28
    ) == pytest.approx(-1.28)
    assert one(
        LN(0.5), 0.0, -1.0, L.ppo_clip, clip_ratio_low=0.1, clip_ratio_high=0.28
    ) == pytest.approx(0.9)
    # dual clip: A<0, ratio 5 -> min(max(5, 1.2), 3) = 3
    assert one(LN(5.0), 0.0, -1.0, L.ppo_clip) == pytest.approx(5.0)
    assert one(LN(5.0), 0.0, -1.0, L.ppo_clip, clip_ratio_c=3.0) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        one(0.0, 0.0, 1.0, L.ppo_clip, clip_ratio_c=0.5)


def test_ppo_stats_are_detached_tensors() -> None:
    lp = torch.tensor([[LN(1.5), 0.0, LN(5.0)]], requires_grad=True)
    out = L.ppo_clip(
        lp,
        torch.zeros(1, 3),
        torch.tensor([[1.0, 1.0, -1.0]]),
        torch.ones(1, 3, dtype=torch.bool),
        clip_ratio_c=3.0,
    )
    assert isinstance(out, L.PolicyLossOutput)
    for v in out.stats.values():
        assert isinstance(v, torch.Tensor) and not v.requires_grad and v.dim() == 0
    assert out.stats["clip_frac"].item() == pytest.approx(
        1 / 3
    )  # token 0 (token 2 is dual-clipped)
    assert out.stats["clip_frac_lower"].item() == pytest.approx(1 / 3)
    assert out.stats["approx_kl"].item() == pytest.approx(-(LN(1.5) + LN(5.0)) / 3, rel=1e-5)
    out.loss("token-mean").backward()
    assert lp.grad is not None and lp.grad[0, 0] == 0  # clipped token carries no gradient


def test_extreme_log_ratio_is_finite() -> None:
    out = L.ppo_clip(
        torch.tensor([[500.0]]),
        torch.tensor([[-500.0]]),
        torch.tensor([[-1.0]]),
        torch.ones(1, 1, dtype=torch.bool),
    )
    assert torch.isfinite(out.loss_mat).all()


def test_cispo_gspo_gmpo_sapo_topr_hand_values() -> None:
    # CISPO: weight clip(2, 0, 1.28) = 1.28 detached; loss = -1.28 * A * log pi
    lp = torch.tensor([[LN(0.5)]], dtype=torch.float64, requires_grad=True)
    out = L.cispo(
        lp,
        lp.detach() - LN(2.0),
        torch.tensor([[2.0]], dtype=torch.float64),
        torch.ones(1, 1, dtype=torch.bool),
    )
    assert out.loss_mat.item() == pytest.approx(-1.28 * 2 * LN(0.5))
    out.loss_mat.sum().backward()
    assert lp.grad is not None and lp.grad.item() == pytest.approx(-1.28 * 2)
    # GSPO: sequence ratio exp(mean(log r)) = exp(0.0002) inside (1-3e-4, 1+4e-4) -> -A s
    lr = torch.tensor([[0.0001, 0.0003]], dtype=torch.float64)
    out = L.gspo(lr, torch.zeros_like(lr), torch.ones_like(lr), torch.ones(1, 2, dtype=torch.bool))
    torch.testing.assert_close(
        out.loss_mat, torch.full((1, 2), -math.exp(0.0002), dtype=torch.float64)
    )
    out = L.gspo(
        lr * 10, torch.zeros_like(lr), torch.ones_like(lr), torch.ones(1, 2, dtype=torch.bool)
    )
    torch.testing.assert_close(out.loss_mat, torch.full((1, 2), -(1 + 4e-4), dtype=torch.float64))
    # GMPO: A>0, log r = [0.1, 0.6] -> min(lr, clip(lr, -.4, .4)) = [0.1, 0.4]; L_seq = -exp(0.25)
    out = L.gmpo(
        torch.tensor([[0.1, 0.6]]),
        torch.zeros(1, 2),
        torch.ones(1, 2),
        torch.ones(1, 2, dtype=torch.bool),
    )
    assert out.loss("seq-mean-token-sum").item() == pytest.approx(-math.exp(0.25), rel=1e-6)
    # A<0: max(lr, clip) -> [0.1, 0.6] mean .35 ; L = +exp(.35)
    out = L.gmpo(
        torch.tensor([[0.1, 0.6]]),
        torch.zeros(1, 2),
        -torch.ones(1, 2),
        torch.ones(1, 2, dtype=torch.bool),
    )
    assert out.loss("seq-mean-token-sum").item() == pytest.approx(math.exp(0.35), rel=1e-6)
    # SAPO at r = 1: value -(2/tau) A, gradient -A (on-policy PG)
    lp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    out = L.sapo(
        lp, torch.zeros(1, 2, dtype=torch.float64), adv, torch.ones(1, 2, dtype=torch.bool)
    )
    torch.testing.assert_close(
        out.loss_mat, torch.tensor([[-2.0, 4.0 / 1.05]], dtype=torch.float64)
    )
    out.loss_mat.sum().backward()
    torch.testing.assert_close(lp.grad, -adv)
    # TOPR: positive -> weight 1; negative -> min(r, 1)
    assert one(LN(0.5), LN(0.25), 1.0, L.topr) == pytest.approx(-LN(0.5))
    assert one(LN(0.5), LN(0.25), -1.0, L.topr) == pytest.approx(LN(0.5))  # r = 2 -> w = 1
    assert one(LN(0.25), LN(0.5), -1.0, L.topr) == pytest.approx(0.5 * LN(0.25))  # r = .5
    assert one(LN(0.25), 0.0, -3.0, L.reinforce) == pytest.approx(3 * LN(0.25))


def test_clip_cov_and_kl_cov_select_high_covariance_tokens() -> None:
    # advantages and log-probs co-vary strongly on token 0 only
    lp = torch.tensor([[3.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[3.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    m = torch.ones(1, 5, dtype=torch.bool)
    old = lp - 0.1
    out = L.kl_cov(lp, old, adv, m, kl_cov_ratio=0.2, ppo_kl_coef=1.0)
    base = -adv * math.exp(0.1)
    expect = base.clone()
    expect[0, 0] += 0.1
    torch.testing.assert_close(out.loss_mat, expect)
    lp_g = lp.clone().requires_grad_(True)
    out = L.clip_cov(
        lp_g,
        old,
        adv,
        m,
        clip_ratio=10.0,
        clip_cov_ratio=0.2,
        clip_cov_lb=1.0,
        clip_cov_ub=100.0,
        generator=torch.Generator().manual_seed(0),
    )
    out.loss_mat.sum().backward()
    assert out.stats["cov_clip_frac"].item() == pytest.approx(0.2)
    assert lp_g.grad is not None
    assert lp_g.grad[0, 0] == 0 and lp_g.grad[0, 1:].abs().sum() == 0  # A=0 elsewhere anyway
    torch.testing.assert_close(out.loss_mat, base)


def test_value_loss_hand_values() -> None:
    out = L.value_loss(
        torch.tensor([[1.5, 1.1]]),
        torch.tensor([[1.0, 1.0]]),
        torch.tensor([[2.0, 2.0]]),
        torch.ones(1, 2, dtype=torch.bool),
        clip_range_value=0.2,
    )
    torch.testing.assert_close(out.loss_mat, torch.tensor([[0.32, 0.5 * 0.81]]))
    assert out.stats["vf_clip_frac"].item() == pytest.approx(0.5)
    out = L.value_loss(
        torch.tensor([[1.5]]),
        torch.tensor([[1.0]]),
        torch.tensor([[2.0]]),
        torch.ones(1, 1, dtype=torch.bool),
        clip_range_value=None,
    )
    assert out.loss_mat.item() == pytest.approx(0.125)


def test_kl_kinds_hand_values() -> None:
    lp, ref = torch.zeros(1, 1), torch.full((1, 1), LN(0.5))
    ln2 = LN(2.0)
    expect = {
        "k1": ln2,
        "kl": ln2,
        "abs": ln2,
        "k2": 0.5 * ln2**2,
        "mse": 0.5 * ln2**2,
        "k3": 0.5 + ln2 - 1,
        "low_var_kl": 0.5 + ln2 - 1,
    }
    for kind, val in expect.items():
        assert kl_penalty(lp, ref, kind).item() == pytest.approx(val, rel=1e-6), kind
    assert kl_penalty(ref, lp, "abs").item() == pytest.approx(ln2)
    assert (
        kl_penalty(torch.zeros(1, 1, dtype=torch.bfloat16), ref.bfloat16(), "k3").dtype
        == torch.float32
    )
    with pytest.raises(KeyError, match="known"):
        kl_penalty(lp, ref, "k7")


def test_full_kl_matches_distributions() -> None:
    torch.manual_seed(0)
    logits, ref_logits = torch.randn(2, 3, 11), torch.randn(2, 3, 11)
    got = kl_penalty(
        torch.zeros(2, 3),
        torch.zeros(2, 3),
        "full",
        logits=logits,
        ref_logits=ref_logits,
        chunk_size=4,
    )
    p, q = (
        torch.distributions.Categorical(logits=logits),
        torch.distributions.Categorical(logits=ref_logits),
    )
    torch.testing.assert_close(got, torch.distributions.kl_divergence(p, q))
    with pytest.raises(ValueError, match="needs logits"):
        kl_penalty(torch.zeros(2, 3), torch.zeros(2, 3), "full")


def test_pair_accuracy_counts_a_tie_as_half() -> None:
    chosen, rejected = torch.tensor([1.0, 0.0, -1.0, 2.0]), torch.tensor([0.0, 0.0, 1.0, 2.0])
    torch.testing.assert_close(L.pair_accuracy(chosen, rejected), torch.tensor([1, 0.5, 0, 0.5]))
    # float noise is a tie, a real margin is not
    noisy = L.pair_accuracy(torch.tensor([1e-6, 1e-3]), torch.tensor([-1e-6, 0.0]))
    torch.testing.assert_close(noisy, torch.tensor([0.5, 1.0]))
    # a policy equal to its reference: every DPO pair tied, accuracy 0.5, ties 1
    same = L.dpo(torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -1.0]),
                 torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -1.0]), beta=0.1)  # fmt: skip
    assert same.stats["reward_accuracy"].item() == 0.5
    assert same.stats["reward_ties"].item() == 1.0


def test_preference_hand_values() -> None:
    t = lambda *x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    out = L.dpo(t(-1.0), t(-3.0), t(-2.0), t(-2.0), beta=0.5)
    assert out.losses.item() == pytest.approx(-math.log(1 / (1 + math.exp(-1))))
    assert out.chosen_rewards.item() == pytest.approx(
        0.5
    ) and out.rejected_rewards.item() == pytest.approx(-0.5)
    assert out.stats["reward_accuracy"].item() == 1.0
    assert out.stats["reward_ties"].item() == 0.0
    cdpo = L.dpo(t(-1.0), t(-3.0), t(-2.0), t(-2.0), beta=0.5, label_smoothing=0.1).losses.item()
    assert cdpo == pytest.approx(0.9 * 0.3132616875 + 0.1 * 1.3132616875)
    assert L.ipo(t(-1.0), t(-3.0), t(-2.0), t(-2.0), beta=0.5).losses.item() == pytest.approx(1.0)
    assert L.simpo(t(-1.0), t(-1.5), beta=2.0, gamma=0.5).losses.item() == pytest.approx(
        0.4740769841
    )
    k = L.kto(t(0.0, 0.0), t(-1.0, -1.0), torch.tensor([True, False]), 0.5, beta=1.0)
    torch.testing.assert_close(
        k.losses, t(1 - 1 / (1 + math.exp(-0.5)), 1 - 1 / (1 + math.exp(0.5)))
    )
    o = L.orpo(t(LN(0.5)), t(LN(0.2)), beta=0.1)
    assert o.losses.item() == pytest.approx(LN(2) + 0.1 * LN(1.25))
    with pytest.raises(ValueError, match="policy_rejected_logps"):
        L.dpo(t(1.0), t(1.0, 2.0), t(1.0), t(1.0))


def test_sft_loss() -> None:
    lp = torch.tensor([[-1.0, -2.0, -9.0]])
    out = L.sft_loss(lp, torch.tensor([[True, True, False]]))
    assert out.loss().item() == pytest.approx(1.5)


# --------------------------------------------------------------------------- gradcheck


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    b, t = 3, 5
    lp = (-torch.rand(b, t, generator=g, dtype=torch.float64) * 2 - 0.1).requires_grad_(True)
    old = lp.detach() + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(b, 1, generator=g, dtype=torch.float64).expand(b, t).contiguous()
    adv[1] = -adv[1].abs()
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[0, :2] = False
    mask[2, 4] = False
    return lp, old, adv, mask


POLICY_CASES = {
    "ppo_clip": {},
    "ppo_clip_asym_dual": {"clip_ratio_low": 0.1, "clip_ratio_high": 0.3, "clip_ratio_c": 1.5},
    "gspo": {"clip_ratio_low": 0.9, "clip_ratio_high": 5.0},  # unclipped: the true seq gradient
    "gspo_clipped": {"clip_ratio_low": 0.05, "clip_ratio_high": 0.05},
    "cispo": {},
    "gmpo": {},
    "clip_cov": {"clip_cov_ratio": 0.0},  # the picked (detached) tokens are tested by hand above
    "kl_cov": {"kl_cov_ratio": 0.3},
    "sapo": {},
    "topr": {},
    "topr_seq": {"level": "sequence"},
    "reinforce": {},
}


@pytest.mark.parametrize("case", sorted(POLICY_CASES))
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_policy_losses_gradcheck(case: str, mode: str) -> None:
    name = case.replace("_asym_dual", "").replace("_seq", "").replace("_clipped", "")
    fn = get_policy_loss(name)
    lp, old, adv, mask = _inputs(hash(case) % 1000)
    kw = dict(POLICY_CASES[case])

    stop_grad_weight = name in ("cispo", "topr")  # weights are sg(f(ratio)) by design
    log_ratio0 = lp.detach().clone() - old

    def f(x):
        extra = {"generator": torch.Generator().manual_seed(0)} if name == "clip_cov" else {}
        # For sg-weighted losses move old_log_probs with x so the detached weight is constant
        # under the finite difference; the analytic gradient is then fully checkable.
        o = x.detach() - log_ratio0 if stop_grad_weight else old
        return fn(x, o, adv, mask, **kw, **extra).loss(mode)

    assert torch.autograd.gradcheck(f, (lp,), eps=1e-6, atol=1e-5)


def test_is_weights_scale_the_loss() -> None:
    lp, old, adv, mask = _inputs(0)
    w = torch.rand(3, 5, dtype=torch.float64)
    a = L.ppo_clip(lp, old, adv, mask).loss_mat
    b = L.ppo_clip(lp, old, adv, mask, is_weights=w).loss_mat
    torch.testing.assert_close(b, a * w)


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "k3"])
def test_kl_gradcheck(kind: str) -> None:
    lp, old, _, _ = _inputs(1)
    assert torch.autograd.gradcheck(lambda x: kl_penalty(x, old, kind), (lp,))


def test_full_kl_and_value_and_sft_gradcheck() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 2, 5, generator=g, dtype=torch.float64, requires_grad=True)
    ref = torch.randn(2, 2, 5, generator=g, dtype=torch.float64)
    z = torch.zeros(2, 2, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda x: kl_penalty(z, z, "full", logits=x, ref_logits=ref), (logits,)
    )
    v = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    old, ret = (
        v.detach() + 0.1 * torch.randn(3, 4, generator=g, dtype=torch.float64),
        torch.randn(3, 4, generator=g, dtype=torch.float64),
    )
    m = torch.ones(3, 4, dtype=torch.bool)
    assert torch.autograd.gradcheck(
        lambda x: L.value_loss(x, old, ret, m, clip_range_value=0.05).loss(), (v,)
    )
    assert torch.autograd.gradcheck(lambda x: L.sft_loss(x, m).loss(), (v,))


def test_preference_gradcheck() -> None:
    g = torch.Generator().manual_seed(4)
    c = (-torch.rand(4, generator=g, dtype=torch.float64) - 0.1).requires_grad_(True)
    r = (-torch.rand(4, generator=g, dtype=torch.float64) - 0.1).requires_grad_(True)
    rc, rr = (
        -torch.rand(4, generator=g, dtype=torch.float64),
        -torch.rand(4, generator=g, dtype=torch.float64),
    )
    des = torch.tensor([True, False, True, False])
    fns = [
        lambda a, b: L.dpo(a, b, rc, rr, label_smoothing=0.1).loss(),
        lambda a, b: L.ipo(a, b, rc, rr).loss(),
        lambda a, b: L.simpo(a, b).loss(),
        lambda a, b: L.kto(a + b, rc, des, 0.2).loss(),
        lambda a, b: L.orpo(a, b).loss(),
    ]
    for fn in fns:
        assert torch.autograd.gradcheck(fn, (c, r))


def test_registry() -> None:
    assert get_policy_loss("ppo") is L.ppo_clip
    with pytest.raises(ValueError, match="already registered"):
        L.register_policy_loss("gspo")(L.reinforce)
    with pytest.raises(KeyError, match="known"):
        get_policy_loss("nope")


def test_reinforce_is_gpg_policy_loss_as_a_plain_loop_computes_it() -> None:
    """GPG's policy loss (Chu et al. 2025, arXiv:2504.02546; verl's loss_mode=gpg) is
    ``-A * log pi`` per token, times the IS weight, then aggregated: no ratio, no clip. Hand
    values: token-mean over the 3 masked tokens of
    ``-(2 ln .5) - (2 ln .25) * .5 - (-1 ln .8)`` and a plain loop over rows and tokens."""
    lp = torch.tensor([[LN(0.5), LN(0.25), LN(0.9)], [LN(0.8), LN(0.3), LN(0.6)]])
    old = torch.tensor([[LN(0.4), LN(0.2), 0.0], [LN(0.7), 0.0, 0.0]])  # not read by GPG
    adv = torch.tensor([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    w = torch.tensor([[1.0, 0.5, 1.0], [1.0, 1.0, 1.0]])
    out = L.reinforce(lp, old, adv, mask, is_weights=w)
    hand = (-2 * LN(0.5) - 2 * LN(0.25) * 0.5 + LN(0.8)) / 3
    assert out.loss("token-mean").item() == pytest.approx(hand, rel=1e-6)
    rows = []
    for b in range(2):
        terms = [-float(lp[b, t]) * float(adv[b, t]) * float(w[b, t])
                 for t in range(3) if mask[b, t]]  # fmt: skip
        rows.append(terms)
    flat = [x for r in rows for x in r]
    assert out.loss("token-mean").item() == pytest.approx(sum(flat) / len(flat), rel=1e-6)
    seq_mean = sum(sum(r) / len(r) for r in rows) / 2
    assert out.loss("seq-mean-token-mean").item() == pytest.approx(seq_mean, rel=1e-6)
