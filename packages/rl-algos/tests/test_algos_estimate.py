"""rl_algos.estimate: the advantage block in one call, against values derived by hand, and
against the composition of rl_algos' parts it replaces (normalise, clip, KL penalty on the
last-token rewards, estimator, whiten, clip), for every registered estimator."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from rl_algos.advantages import get_estimator, list_estimators
from rl_algos.aggregate import masked_whiten
from rl_algos.estimate import (
    clip_row_values,
    estimate_advantages,
    estimator_needs,
    last_token_rewards,
    reward_clip_site,
    step_rows,
)
from rl_algos.kl_control import apply_kl_penalty
from rl_algos.rewards import clip_rewards, normalize_rewards

# estimators defined without a group std (rl_config.schema.algorithm.STD_FREE_ESTIMATORS)
STD_FREE = {"dr_grpo", "rloo", "reinforce_pp", "reinforce_plus_plus", "reinforce_pp_baseline",
            "reinforce_plus_plus_baseline", "remax", "opo", "gpg", "optimal_token_baseline"}  # fmt: skip


def test_grpo_puts_each_rows_group_z_score_on_its_model_tokens():
    """Rewards [1, 0] in one group: mean 0.5, unbiased std 1/sqrt(2), so z = +-1/sqrt(2); grpo's
    own z-score of those is the same up to epsilon. Row 0's third token is not the model's."""
    mask = torch.tensor([[True, True, False], [True, True, True]])
    out = estimate_advantages(torch.tensor([1.0, 0.0]), mask, torch.tensor([0, 0]), "grpo")
    z = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert out["scores"].tolist() == pytest.approx([z, -z], abs=1e-6)
    want = torch.tensor([[z, z, 0.0], [-z, -z, -z]])
    assert torch.allclose(out["advantages"], want, atol=1e-5)
    assert set(out) == {"scores", "advantages", "returns"}


def test_a_reward_kl_penalty_is_subtracted_per_token_before_the_reward_to_go():
    """One row, reward 2 on its last token; k1 KL = log_probs - ref = [0.5, 0, -0.5], coefficient
    0.2: token rewards [-0.1, 0, 2.1]; reinforce (gamma 1) sums them to go: [2.0, 2.1, 2.1]."""
    mask = torch.ones(1, 3, dtype=torch.bool)
    out = estimate_advantages(
        torch.tensor([2.0]),
        mask,
        torch.tensor([0]),
        "reinforce",
        method="identity",
        kl_coef=0.2,
        log_probs=torch.tensor([[-1.0, -1.0, -1.0]]),
        ref_log_probs=torch.tensor([[-1.5, -1.0, -0.5]]),
    )
    assert out["kl"][0].tolist() == pytest.approx([0.5, 0.0, -0.5])
    assert out["advantages"][0].tolist() == pytest.approx([2.0, 2.1, 2.1])
    assert out["returns"][0].tolist() == pytest.approx([2.0, 2.1, 2.1])


def test_reward_clip_on_the_scores_of_rloo():
    """rloo takes the clamped scores: rewards [0, 0, 3] clamped to [0, 0, 1] (1 of 3 clamped);
    each row minus the mean of the others: [-0.5, -0.5, 1]."""
    assert reward_clip_site("rloo") == "scores"
    out = estimate_advantages(
        torch.tensor([0.0, 0.0, 3.0]),
        torch.ones(3, 2, dtype=torch.bool),
        torch.tensor([0, 0, 0]),
        "rloo",
        method="identity",
        reward_clip=1.0,
    )
    assert out["scores"].tolist() == [0.0, 0.0, 1.0]
    assert float(out["reward_clip_frac"]) == pytest.approx(1 / 3)
    assert out["advantages"][:, 0].tolist() == pytest.approx([-0.5, -0.5, 1.0])


def test_whitening_then_the_advantage_clip_and_returns_untouched():
    """reinforce on rewards [1, 3] (identity): advantages [[1, 1], [3, 3]]; masked mean 2,
    unbiased variance 4/3, so whitened -+sqrt(3)/2 = -+0.866, clamped to -+0.5; the returns keep
    the reward-to-go."""
    out = estimate_advantages(
        torch.tensor([1.0, 3.0]),
        torch.ones(2, 2, dtype=torch.bool),
        torch.tensor([0, 1]),
        "reinforce",
        method="identity",
        whiten=True,
        advantage_clip=0.5,
    )
    assert out["advantages"].tolist() == [[-0.5, -0.5], [0.5, 0.5]]
    assert out["returns"].tolist() == [[1.0, 1.0], [3.0, 3.0]]
    no_clip = estimate_advantages(
        torch.tensor([1.0, 3.0]),
        torch.ones(2, 2, dtype=torch.bool),
        torch.tensor([0, 1]),
        "reinforce",
        method="identity",
        whiten=True,
    )
    s = math.sqrt(3) / 2
    assert no_clip["advantages"].flatten().tolist() == pytest.approx([-s, -s, s, s], abs=1e-6)


def test_step_rows_one_per_model_turn_with_shared_observations_as_one_anchor():
    """Two rows of two turns: tokens [p, p, a, a, o, b] with turns (2, 4) and (5, 6); the turn
    after the same observation tokens gets the same anchor; a turn without model tokens is no
    row."""
    ids = torch.tensor([[1, 1, 5, 5, 9, 6], [1, 1, 5, 5, 8, 6]])
    mask = torch.tensor([[0, 0, 1, 1, 0, 1], [0, 0, 1, 1, 0, 0]], dtype=torch.bool)
    turn = torch.tensor([[-1, -1, 0, 0, -1, 1], [-1, -1, 0, 0, -1, 1]])
    rewards = torch.tensor([[0, 0, 0, 0.5, 0, 1.0], [0, 0, 0, 0.25, 0, 0]])
    rows = step_rows(mask, turn, rewards, ids, [[(2, 4), (5, 6)], [(2, 4), (5, 6)]])
    assert rows["row_of"].tolist() == [0, 0, 1]
    assert rows["step_ids"].tolist() == [0, 1, 0]
    assert rows["step_rewards"].tolist() == [0.5, 1.0, 0.25]
    assert rows["anchor_ids"].tolist() == [0, 1, 0]  # both first turns follow [1, 1]
    assert rows["step_mask"].int().tolist() == [
        [0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 1],
        [0, 0, 1, 1, 0, 0],
    ]
    with pytest.raises(ValueError, match="no model turns"):
        step_rows(mask & False, turn, rewards, ids, [[(2, 4)], [(2, 4)]])


def _composed(rewards, mask, groups, name, *, method, clip, kl_coef, lp, ref, values, base,
              steps, whiten, adv_clip, sp=None):  # fmt: skip
    """The composition of rl_algos' parts `estimate_advantages` replaces, call by call."""
    needs, fn = estimator_needs(name), get_estimator(name)
    params = inspect.signature(fn).parameters
    scores = normalize_rewards(rewards, grouping="group", index=groups, method=method)
    at_scores = clip is not None and reward_clip_site(name) == "scores"
    if at_scores:
        scores = clip_rewards(scores, clip)
    token = scores
    if kl_coef > 0 or "values" in needs:
        token = last_token_rewards(scores, mask)
    if kl_coef > 0:
        token, _ = apply_kl_penalty(token, lp, ref, mask.float(), kl_coef, "k1")
    kw = {"gamma": 0.95 if "step_rows" in needs else 1.0} if "gamma" in params else {}
    if "values" in needs:
        adv, ret = fn(token, values, mask, lam=1.0, **kw)
    elif "step_rows" in needs:
        r = steps["row_of"]
        offered = {"traj_ids": r, "step_ids": steps["step_ids"], "step_rewards":
                   steps["step_rewards"], "anchor_ids": steps["anchor_ids"], "step_weight": 1.0,
                   "episode_weight": 1.0, "token_gamma": 1.0, "method": method}  # fmt: skip
        sk = {k: v for k, v in offered.items() if k in params}
        s_adv, _ = fn(scores[r], steps["step_mask"], groups[r], **sk, **kw)
        s_adv = s_adv.float()
        if clip is not None:
            s_adv, _ = clip_row_values(s_adv, steps["step_mask"], clip)
        adv = ret = torch.zeros(mask.shape).index_add_(0, r, s_adv)
    else:
        if "baseline_scores" in needs:
            b = normalize_rewards(base, grouping="group", index=groups, method=method)
            kw["baseline_scores"] = clip_rewards(b, clip) if at_scores else b
        if "sum_pi_squared" in needs:
            kw.update(old_log_probs=lp, sum_pi_squared=sp)
        adv, ret = fn(token, mask, groups, **kw)
        if clip is not None and not at_scores:
            c, _ = clip_row_values(adv.float(), mask, clip)
            adv, ret = c, (c if ret is adv else ret)
    adv = adv.float()
    if whiten:
        adv = masked_whiten(adv, mask)
    if adv_clip:
        adv = adv.clamp(-adv_clip, adv_clip)
    return adv * mask, ret.float() * mask


@pytest.mark.parametrize("name", list_estimators())
@pytest.mark.parametrize(
    ("clip", "kl_coef", "whiten", "adv_clip"),
    [(None, 0.0, False, None), (0.6, 0.0, False, None), (None, 0.1, True, 0.8)],
)
def test_one_call_equals_the_composition_of_the_parts(name, clip, kl_coef, whiten, adv_clip):
    gen = torch.Generator().manual_seed(3)
    B, T = 8, 6
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[:, :2] = False
    mask[1, 5] = False
    rewards = torch.tensor([0.0, 0.05, 0.0, 10.0, 1.0, 0.0, 0.5, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    lp, ref = -torch.rand(B, T, generator=gen), -torch.rand(B, T, generator=gen)
    values = torch.randn(B, T, generator=gen)
    base = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.2, 0.2, 0.2, 0.2])
    turn = torch.where(mask, torch.tensor([-1, -1, 0, 0, 1, 1]).expand(B, T), -1)
    ids = torch.randint(0, 4, (B, T), generator=gen)
    tok_rewards = torch.rand(B, T, generator=gen)
    steps = step_rows(mask, turn, tok_rewards, ids, [[(2, 4), (4, 6)]] * B)
    sp = torch.rand(B, T, generator=gen)
    method = "identity" if name in STD_FREE else "mean_std"
    needs = estimator_needs(name)
    kl_coef = 0.0 if "step_rows" in needs else kl_coef  # step-wise: turn rewards, no token KL
    want_adv, want_ret = _composed(
        rewards, mask, groups, name, method=method, clip=clip, kl_coef=kl_coef, lp=lp, ref=ref,
        values=values, base=base, steps=steps, whiten=whiten, adv_clip=adv_clip, sp=sp,
    )  # fmt: skip
    out = estimate_advantages(
        rewards, mask, groups, name, method=method, reward_clip=clip, kl_coef=kl_coef,
        log_probs=lp, ref_log_probs=ref, values=values if "values" in needs else None,
        baseline_scores=base if "baseline_scores" in needs else None,
        steps=steps if "step_rows" in needs else None, step_gamma=0.95,
        sum_pi_squared=sp if "sum_pi_squared" in needs else None,
        whiten=whiten, advantage_clip=adv_clip,
    )  # fmt: skip
    assert torch.equal(out["advantages"], want_adv)
    assert torch.equal(out["returns"], want_ret)


def test_what_an_estimator_needs_is_asked_for_by_name():
    assert estimator_needs("gae") == {"values"}
    assert estimator_needs("remax") == {"baseline_scores"}
    assert estimator_needs("gigpo") == {"step_rows"}
    assert estimator_needs("optimal_token_baseline") == {"sum_pi_squared"}
    mask = torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="needs critic values"):
        estimate_advantages(torch.ones(2), mask, torch.zeros(2, dtype=torch.long), "gae")
    with pytest.raises(ValueError, match="needs baseline_scores"):
        estimate_advantages(torch.ones(2), mask, torch.zeros(2, dtype=torch.long), "remax")
    with pytest.raises(ValueError, match="needs the old policy's log_probs and sum_pi_squared"):
        estimate_advantages(torch.ones(2), mask, torch.zeros(2, dtype=torch.long),
                            "optimal_token_baseline", log_probs=torch.zeros(2, 2))  # fmt: skip
    with pytest.raises(ValueError, match="needs log_probs and ref_log_probs"):
        estimate_advantages(torch.ones(2), mask, torch.zeros(2, dtype=torch.long), kl_coef=0.1)
