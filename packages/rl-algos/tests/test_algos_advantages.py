"""Advantage estimators: hand-derived values and plain-loop reference implementations."""

from __future__ import annotations

import math

import pytest
import torch

from rl_algos import advantages as A
from rl_algos.advantages import get_estimator, register_estimator

# --------------------------------------------------------------------------- loop references


def loop_gae(r, v, m, gamma, lam):
    b, t = r.shape
    adv = torch.zeros(b, t, dtype=torch.float64)
    for i in range(b):
        last, next_v = 0.0, 0.0
        for j in reversed(range(t)):
            if not m[i, j]:
                continue
            delta = float(r[i, j]) + gamma * next_v - float(v[i, j])
            last = delta + gamma * lam * last
            next_v = float(v[i, j])
            adv[i, j] = last
    ret = torch.where(m, adv + v.double(), torch.zeros_like(adv))
    return adv, ret


def loop_returns(r, m, gamma):
    out = torch.zeros(r.shape, dtype=torch.float64)
    for i in range(r.shape[0]):
        acc = 0.0
        for j in reversed(range(r.shape[1])):
            if m[i, j]:
                acc = float(r[i, j]) + gamma * acc
                out[i, j] = acc
    return out


def loop_groups(index):
    groups: dict = {}
    for i, k in enumerate(index):
        groups.setdefault(k, []).append(i)
    return groups


def loop_mean_std(vals):
    n = len(vals)
    mean = sum(vals) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in vals) / (n - 1)) if n > 1 else 0.0
    return mean, std


def loop_grpo(s, index, eps=1e-6, norm=True):
    out = [0.0] * len(s)
    for rows in loop_groups(index).values():
        vals = [float(s[i]) for i in rows]
        mean, std = loop_mean_std(vals)
        if len(rows) == 1:
            mean, std = 0.0, 1.0
        for i in rows:
            out[i] = (float(s[i]) - mean) / (std + eps) if norm else float(s[i]) - mean
    return out


def loop_rloo(s, index):
    out = [0.0] * len(s)
    for rows in loop_groups(index).values():
        for i in rows:
            others = [float(s[j]) for j in rows if j != i]
            out[i] = float(s[i]) - sum(others) / len(others) if others else float(s[i])
    return out


def loop_opo(s, lengths, index):
    out = [0.0] * len(s)
    for rows in loop_groups(index).values():
        tot = sum(lengths[i] for i in rows)
        base = (
            sum(lengths[i] * float(s[i]) for i in rows) / tot if len(rows) > 1 and tot > 0 else 0.0
        )
        for i in rows:
            out[i] = float(s[i]) - base
    return out


def loop_gpg(s, index, eps=1e-6):
    groups = loop_groups(index)
    valid = 0
    means = {}
    for k, rows in groups.items():
        mean, std = loop_mean_std([float(s[i]) for i in rows])
        means[k] = mean
        if std > eps:
            valid += len(rows)
    alpha = len(s) / max(valid, 1)
    return [alpha * (float(s[i]) - means[k]) for i, k in enumerate(index)]


def loop_passk(s, index, eps=1e-6):
    out = [0.0] * len(s)
    for rows in loop_groups(index).values():
        vals = [float(s[i]) for i in rows]
        best = rows[max(range(len(rows)), key=lambda j: (vals[j], -j))]
        second = max(float(s[i]) for i in rows if i != best)
        _, std = loop_mean_std(vals)
        out[best] = (float(s[best]) - second) / (std + eps)
    return out


def broadcast(per_row, m):
    return torch.tensor(per_row, dtype=torch.float64).unsqueeze(-1) * m


def rand_index(b, seed, kind):
    g = torch.Generator().manual_seed(seed + 100)
    ids = torch.randint(0, max(1, b // 3), (b,), generator=g)
    if kind == "tensor":
        return ids
    if kind == "big_tensor":
        return ids * 1_000_003 + 7  # non-dense ids go through torch.unique
    return [f"uid-{int(i)}" for i in ids]


# --------------------------------------------------------------------------- GAE


def test_gae_hand_derived() -> None:
    # one row, response tokens at t=1,2 (t=0 prompt, t=3 padding); gamma=0.5, lam=0.5
    r = torch.tensor([[9.0, 0.0, 1.0, 9.0]])
    v = torch.tensor([[9.0, 2.0, 4.0, 9.0]])
    m = torch.tensor([[False, True, True, False]])
    adv, ret = A.gae(r, v, m, gamma=0.5, lam=0.5)
    # t=2: delta = 1 + 0.5*0 - 4 = -3, A=-3 ; t=1: delta = 0 + 0.5*4 - 2 = 0, A = 0 + 0.25*(-3)
    torch.testing.assert_close(adv, torch.tensor([[0.0, -0.75, -3.0, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.0, 1.25, 1.0, 0.0]]))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.0, 0.5)])
def test_gae_matches_loop(seed: int, gamma: float, lam: float, layout: str, make_mask) -> None:
    torch.manual_seed(seed)
    b, t = 6, 150  # > one scan block, not a multiple of it
    m = make_mask(b, t, seed, layout)
    r, v = torch.randn(b, t), torch.randn(b, t)
    adv, ret = A.gae(r, v, m, gamma, lam)
    ref_adv, ref_ret = loop_gae(r, v, m, gamma, lam)
    torch.testing.assert_close(adv.double(), ref_adv, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ret.double(), ref_ret, atol=2e-5, rtol=1e-5)
    assert (adv[0] == 0).all()  # empty row


def test_gae_float64_is_exact_and_long_horizon() -> None:
    torch.manual_seed(0)
    m = torch.ones(2, 3000, dtype=torch.bool)
    r, v = torch.randn(2, 3000, dtype=torch.float64), torch.randn(2, 3000, dtype=torch.float64)
    adv, _ = A.gae(r, v, m, 0.999, 0.99)
    ref, _ = loop_gae(r, v, m, 0.999, 0.99)
    torch.testing.assert_close(adv, ref, atol=1e-10, rtol=1e-10)


def test_gae_shape_error() -> None:
    with pytest.raises(ValueError, match="must all be"):
        A.gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool))


# --------------------------------------------------------------------------- returns-based


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reinforce_pp_matches_loop(seed: int, layout: str, make_mask) -> None:
    torch.manual_seed(seed)
    m = make_mask(7, 40, seed, layout)
    r = torch.randn(7, 40)
    adv, ret = A.reinforce_pp(r, m, gamma=0.9)
    ref_ret = loop_returns(r, m, 0.9)
    torch.testing.assert_close(ret.double(), ref_ret, atol=1e-5, rtol=1e-5)
    vals = ref_ret[m]
    ref_adv = torch.zeros_like(ref_ret)
    ref_adv[m] = (vals - vals.mean()) / (vals.var() + 1e-8).sqrt()
    torch.testing.assert_close(adv.double(), ref_adv, atol=1e-4, rtol=1e-4)
    r1, _ = A.reinforce_returns(r, m, gamma=0.9)
    torch.testing.assert_close(r1.double(), ref_ret, atol=1e-5, rtol=1e-5)


def test_outcome_score_goes_on_last_response_token() -> None:
    m = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    ret, _ = A.reinforce_returns(torch.tensor([2.0, 5.0]), m, gamma=0.5)
    torch.testing.assert_close(ret, torch.tensor([[0, 0.5, 1.0, 0, 2.0, 0], [0.0] * 6]))


def test_remax_hand_values() -> None:
    m = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    adv, ret = A.remax(torch.tensor([1.0, 0.0]), m, baseline_scores=torch.tensor([0.25, 0.5]))
    torch.testing.assert_close(adv, torch.tensor([[0.75, 0.75, 0.0], [-0.5, -0.5, -0.5]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="baseline_scores"):
        A.remax(torch.ones(2), m, baseline_scores=torch.ones(3))


# --------------------------------------------------------------------------- group estimators


def test_grpo_hand_values() -> None:
    s = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.3])
    m = torch.ones(6, 2, dtype=torch.bool)
    adv, ret = A.grpo(s, m, ["a", "a", "a", "a", "b", "c"])
    # group a: mean .5, unbiased std sqrt(1/3); groups b and c have one row: raw score kept
    d = math.sqrt(1 / 3) + 1e-6
    expect = torch.tensor(
        [0.5 / d, -0.5 / d, -0.5 / d, 0.5 / d, 1.0 / (1 + 1e-6), 0.3 / (1 + 1e-6)]
    )
    torch.testing.assert_close(adv[:, 0], expect)
    assert ret is adv
    dr, _ = A.dr_grpo(s, m, ["a", "a", "a", "a", "b", "c"])
    torch.testing.assert_close(dr[:, 1], torch.tensor([0.5, -0.5, -0.5, 0.5, 1.0, 0.3]))


def test_rloo_hand_values() -> None:
    adv, _ = A.rloo(torch.tensor([1.0, 2.0, 6.0]), torch.ones(3, 1, dtype=torch.bool), [0, 0, 0])
    torch.testing.assert_close(adv[:, 0], torch.tensor([1 - 4.0, 2 - 3.5, 6 - 1.5]))


def test_opo_hand_values() -> None:
    m = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)  # lengths 1 and 3
    adv, _ = A.opo(torch.tensor([1.0, 0.0]), m, [7, 7])
    # baseline = (1*1 + 3*0)/4 = 0.25
    torch.testing.assert_close(adv, torch.tensor([[0.75, 0, 0], [-0.25, -0.25, -0.25]]))


def test_gpg_hand_values() -> None:
    # group 0 has spread (2 valid rows), group 1 is degenerate -> alpha = 4 / 2
    adv, _ = A.gpg(
        torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.ones(4, 1, dtype=torch.bool), [0, 0, 1, 1]
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_grpo_passk_hand_values_and_error() -> None:
    s = torch.tensor([0.2, 0.9, 0.5, 1.0, 1.0])
    adv, _ = A.grpo_passk(s, torch.ones(5, 1, dtype=torch.bool), [0, 0, 0, 1, 1], norm_by_std=False)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.0, 0.4, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="row 2"):
        A.grpo_passk(torch.ones(3), torch.ones(3, 1, dtype=torch.bool), [0, 0, 1])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("index_kind", ["tensor", "big_tensor", "strings"])
def test_group_estimators_match_loops(seed: int, index_kind: str, layout: str, make_mask) -> None:
    torch.manual_seed(seed)
    b, t = 24, 16
    m = make_mask(b, t, seed, layout)
    s = torch.randint(0, 3, (b,)).double() / 2  # ties on purpose
    index = rand_index(b, seed, index_kind)
    keys = [int(i) for i in index] if isinstance(index, torch.Tensor) else index
    lengths = [int(x) for x in m.sum(-1)]
    checks = {
        "grpo": (A.grpo(s, m, index)[0], loop_grpo(s, keys)),
        "dr_grpo": (A.dr_grpo(s, m, index)[0], loop_grpo(s, keys, norm=False)),
        "rloo": (A.rloo(s, m, index)[0], loop_rloo(s, keys)),
        "opo": (A.opo(s, m, index)[0], loop_opo(s, lengths, keys)),
        "gpg": (A.gpg(s, m, index)[0], loop_gpg(s, keys)),
    }
    for name, (got, ref) in checks.items():
        torch.testing.assert_close(got.double(), broadcast(ref, m), atol=1e-9, rtol=1e-9, msg=name)
    # reinforce++-baseline: group-mean baseline then batch whitening
    base = [
        float(s[i]) - (loop_mean_std([float(s[j]) for j in rows])[0] if len(rows) > 1 else 0.0)
        for i, rows in ((i, loop_groups(keys)[k]) for i, k in enumerate(keys))
    ]
    tok = broadcast(base, m)
    vals = tok[m]
    ref = torch.zeros_like(tok)
    ref[m] = (vals - vals.mean()) / (vals.var() + 1e-8).sqrt()
    torch.testing.assert_close(
        A.reinforce_pp_baseline(s, m, index)[0].double(), ref, atol=1e-6, rtol=1e-6
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_passk_matches_loop(seed: int) -> None:
    torch.manual_seed(seed)
    index = [i // 4 for i in range(32)]
    s = torch.randint(0, 4, (32,)).double()
    adv, _ = A.grpo_passk(s, torch.ones(32, 3, dtype=torch.bool), index)
    torch.testing.assert_close(adv[:, 0], torch.tensor(loop_passk(s, index), dtype=torch.float64))


def test_token_level_scores_are_summed_over_response() -> None:
    m = torch.tensor([[1, 1, 0], [0, 1, 1]], dtype=torch.bool)
    tok = torch.tensor([[1.0, 2.0, 100.0], [100.0, 0.5, 0.5]])
    a1, _ = A.dr_grpo(tok, m, [0, 0])
    a2, _ = A.dr_grpo(torch.tensor([3.0, 1.0]), m, [0, 0])
    torch.testing.assert_close(a1, a2)


def test_index_errors() -> None:
    m = torch.ones(3, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="B=3"):
        A.grpo(torch.ones(3), m, [0, 1])
    with pytest.raises(ValueError, match="index must be"):
        A.grpo(torch.ones(3), m, torch.zeros(2, dtype=torch.long))


# --------------------------------------------------------------------------- GiGPO


def test_gigpo_hand_values() -> None:
    # one episode group, two trajectories of two steps; both start in state "s0".
    # traj a: rewards 0 then 1 (R=1); traj b: rewards 0 then 0 (R=0); gamma = 0.5
    rows = dict(
        traj_ids=["a", "a", "b", "b"],
        step_ids=torch.tensor([0, 1, 0, 1]),
        step_rewards=torch.tensor([0.0, 1.0, 0.0, 0.0]),
        anchor_ids=["s0", "s1", "s0", "s2"],
    )
    scores = torch.tensor([1.0, 1.0, 0.0, 0.0])
    m = torch.ones(4, 1, dtype=torch.bool)
    adv, _ = A.gigpo(scores, m, [0, 0, 0, 0], gamma=0.5, norm_by_std=False, **rows)
    # episode: mean over 2 trajectories 0.5 -> +0.5 / -0.5
    # step returns: a0 = 0 + .5*1 = .5, a1 = 1, b0 = 0, b1 = 0; anchor s0 groups a0,b0 (mean .25)
    # s1 and s2 are singletons -> 0
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5 + 0.25, 0.5, -0.5 - 0.25, -0.5]))
    adv2, _ = A.gigpo(scores, m, [0, 0, 0, 0], gamma=0.5, norm_by_std=True, step_weight=2.0, **rows)
    ep = 0.5 / (math.sqrt(0.5) + 1e-6)
    st = 0.25 / (math.sqrt(0.125) + 1e-6)
    torch.testing.assert_close(adv2[:, 0], torch.tensor([ep + 2 * st, ep, -ep - 2 * st, -ep]))


def test_gigpo_validates_inputs() -> None:
    m = torch.ones(2, 1, dtype=torch.bool)
    kw = dict(traj_ids=["a", "a"], step_rewards=torch.zeros(2), anchor_ids=[0, 1])
    with pytest.raises(ValueError, match="scores differ"):
        A.gigpo(torch.tensor([1.0, 0.0]), m, [0, 0], step_ids=torch.tensor([0, 1]), **kw)
    with pytest.raises(ValueError, match="more than one row"):
        A.gigpo(torch.tensor([1.0, 1.0]), m, [0, 0], step_ids=torch.tensor([0, 0]), **kw)


# --------------------------------------------------------------------------- step REINFORCE


def test_step_reinforce_hand_values() -> None:
    # one group, two trajectories: a = (0, 1), b = (0, 0, 2); step_reward_gamma = 0.5
    # step returns: a0 = 0 + .5*1 = .5, a1 = 1; b0 = .25*2 = .5, b1 = .5*2 = 1, b2 = 2
    rows = dict(
        traj_ids=["a", "a", "b", "b", "b"],
        step_ids=torch.tensor([0, 1, 0, 1, 2]),
        step_rewards=torch.tensor([0.0, 1.0, 0.0, 0.0, 2.0]),
    )
    m = torch.ones(5, 2, dtype=torch.bool)
    adv, ret = A.step_reinforce(torch.zeros(5), m, [0] * 5, gamma=0.5, method="identity", **rows)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, 1.0, 0.5, 1.0, 2.0]))
    assert adv is ret and bool((adv[:, 0] == adv[:, 1]).all())  # token_gamma 1: whole step
    # mean 1.0 -> centred [-.5, 0, -.5, 0, 1]; unbiased std sqrt(1.5 / 4)
    adv, _ = A.step_reinforce(torch.zeros(5), m, [0] * 5, gamma=0.5, **rows)
    std = math.sqrt(1.5 / 4)
    want = torch.tensor([-0.5, 0.0, -0.5, 0.0, 1.0]) / (std + 1e-6)
    torch.testing.assert_close(adv[:, 1], want)


def test_step_reinforce_groups_mask_and_token_discount() -> None:
    # two groups of one trajectory each: within a group the steps are compared with each other;
    # the normalised return sits on the step's last token and is discounted back by token_gamma
    rows = dict(
        traj_ids=["a", "a", "b", "b"],
        step_ids=torch.tensor([1, 0, 0, 1]),  # rows need not be in step order
        step_rewards=torch.tensor([3.0, 1.0, 0.0, 0.0]),
    )
    m = torch.tensor([[1, 1, 0], [0, 1, 1], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    adv, _ = A.step_reinforce(
        torch.zeros(4), m, [7, 7, 9, 9], gamma=1.0, token_gamma=0.5, method="mean", **rows
    )
    # group 7: returns a1 = 3, a0 = 1 + 3 = 4 -> mean 3.5 -> a1 -0.5, a0 +0.5; group 9: all 0
    want = torch.tensor([[-0.25, -0.5, 0.0], [0.0, 0.25, 0.5], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, want)


def loop_step_reinforce(traj, steps, rewards, index, mask, gamma, token_gamma):
    returns = {}
    for t in set(traj):
        rows = sorted((steps[i], i) for i in range(len(traj)) if traj[i] == t)
        acc = 0.0
        for _, i in reversed(rows):
            acc = rewards[i] + gamma * acc
            returns[i] = acc
    normed = {}
    for g in set(index):
        rows = [i for i in range(len(traj)) if index[i] == g]
        vals = [returns[i] for i in rows]
        mean = sum(vals) / len(vals)
        var = sum((v - mean) ** 2 for v in vals) / max(len(vals) - 1, 1)
        for i in rows:
            normed[i] = (returns[i] - mean) / (math.sqrt(var) + 1e-6)
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for i in range(mask.shape[0]):
        cols = [j for j in range(mask.shape[1]) if mask[i, j]]
        acc = 0.0
        for k, j in enumerate(reversed(cols)):
            acc = (normed[i] if k == 0 else 0.0) + token_gamma * acc
            out[i, j] = acc
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_step_reinforce_matches_loop(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    traj, steps, index = [], [], []
    for t in range(12):  # 12 trajectories of 1..5 steps in 4 groups, rows shuffled
        n = int(torch.randint(1, 6, (1,), generator=gen))
        traj += [f"t{t}"] * n
        steps += list(range(n))
        index += [t % 4] * n
    order = torch.randperm(len(traj), generator=gen).tolist()
    traj = [traj[i] for i in order]
    steps = [steps[i] for i in order]
    index = [index[i] for i in order]
    b = len(traj)
    rewards = torch.randn(b, generator=gen, dtype=torch.float64)
    mask = torch.rand(b, 7, generator=gen) < 0.7
    adv, _ = A.step_reinforce(
        torch.zeros(b, dtype=torch.float64),
        mask,
        index,
        traj_ids=traj,
        step_ids=torch.tensor(steps),
        step_rewards=rewards,
        gamma=0.9,
        token_gamma=0.8,
    )
    want = loop_step_reinforce(traj, steps, rewards.tolist(), index, mask, 0.9, 0.8)
    torch.testing.assert_close(adv, want)


def test_step_reinforce_validates_inputs() -> None:
    m = torch.ones(2, 1, dtype=torch.bool)
    kw = dict(traj_ids=["a", "a"], step_rewards=torch.zeros(2))
    with pytest.raises(ValueError, match="step_reinforce: a .trajectory, step. pair"):
        A.step_reinforce(torch.zeros(2), m, [0, 0], step_ids=torch.tensor([0, 0]), **kw)
    with pytest.raises(ValueError, match="step_ids must be >= 0"):
        A.step_reinforce(torch.zeros(2), m, [0, 0], step_ids=torch.tensor([0, -1]), **kw)
    with pytest.raises(ValueError, match="B=2"):
        A.step_reinforce(torch.zeros(2), m, [0, 0], step_ids=torch.tensor([0]), **kw)


# --------------------------------------------------------------------------- registry


def test_registry() -> None:
    for name in (
        "gae",
        "grpo",
        "dr_grpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "opo",
        "gpg",
        "grpo_passk",
        "gigpo",
        "step_reinforce",
        "optimal_token_baseline",
    ):
        assert callable(get_estimator(name))
    assert get_estimator("grpo") is A.grpo
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("grpo")(A.rloo)
    with pytest.raises(KeyError, match="known"):
        get_estimator("nope")


# --------------------------------------------------------------------------- optimal token baseline


def _otb_loop(scores, mask, index, lp, sp, eps=1e-8):
    """Optimal token baseline, one row, group and response position at a time (the spec)."""
    b = mask.shape[0]
    cols = [[t for t in range(mask.shape[1]) if mask[i, t]] for i in range(b)]
    g, w = [], []
    for i in range(b):
        tail, acc, gi, wi = 0.0, 0.0, [], []
        for t in reversed(cols[i]):
            tail += float(scores[i]) if t == cols[i][-1] else 0.0
            gi.insert(0, tail)
        for t in cols[i]:
            acc += 1 - 2 * math.exp(float(lp[i, t])) + float(sp[i, t])
            wi.append(acc)
        g.append(gi)
        w.append(wi)
    adv = torch.zeros(mask.shape, dtype=torch.float64)
    for i in range(b):
        group = [k for k in range(b) if index[k] == index[i]]
        for j, t in enumerate(cols[i]):
            base = 0.0
            if len(group) > 1:
                rows = [k for k in group if j < len(cols[k])]
                num = sum(g[k][j] * w[k][j] for k in rows)
                base = num / (sum(w[k][j] for k in rows) + eps)
            adv[i, t] = g[i][j] - base
    return adv


def test_optimal_token_baseline_hand_derived_values():
    """The docstring's example: B = [0.5 / 1.25, 0.5 / 1.75]; row 1's response starts one column
    later (a longer prompt): positions count response tokens. Row 2 is a group of one: A = G."""
    mask = torch.tensor([[1, 1, 0], [0, 1, 1], [1, 0, 0]], dtype=torch.bool)
    pi = torch.tensor([[0.5, 1.0, 1.0], [1.0, 0.25, 0.5], [0.3, 1.0, 1.0]])
    sp = torch.tensor([[0.5, 1.0, 0.0], [0.0, 0.25, 0.5], [0.4, 0.0, 0.0]])
    adv, ret = A.optimal_token_baseline(
        torch.tensor([1.0, 0.0, 2.0]), mask, torch.tensor([0, 0, 1]),
        old_log_probs=pi.log(), sum_pi_squared=sp,
    )  # fmt: skip
    want = torch.tensor([[0.6, 5 / 7, 0.0], [0.0, -0.4, -2 / 7], [2.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1, 0], [0, 0, 0], [2, 0, 0]]))


def test_optimal_token_baseline_equals_the_plain_loop():
    gen = torch.Generator().manual_seed(0)
    B, T = 9, 7
    mask = torch.rand(B, T, generator=gen) > 0.3  # ragged, gapped responses, one may be empty
    scores = torch.randn(B, generator=gen, dtype=torch.float64)
    index = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3])
    lp = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    sp = torch.rand(B, T, generator=gen, dtype=torch.float64)
    adv, _ = A.optimal_token_baseline(scores, mask, index, old_log_probs=lp, sum_pi_squared=sp)
    torch.testing.assert_close(adv, _otb_loop(scores, mask, index, lp, sp), atol=1e-9, rtol=1e-9)


def test_gae_ignores_what_lies_outside_the_mask() -> None:
    """Prompt and padding positions may hold anything (NaN, inf): the result is that of zeros."""
    torch.manual_seed(0)
    m = torch.zeros(3, 40, dtype=torch.bool)
    m[0, 5:30] = m[1, 0:40] = m[2, 10:11] = True
    r, v = torch.randn(3, 40), torch.randn(3, 40)
    dirty_r = torch.where(m, r, torch.nan)
    dirty_v = torch.where(m, v, torch.inf)
    adv, ret = A.gae(dirty_r, dirty_v, m, 0.99, 0.95)
    clean_adv, clean_ret = A.gae(torch.where(m, r, 0.0), torch.where(m, v, 0.0), m, 0.99, 0.95)
    assert torch.equal(adv, clean_adv) and torch.equal(ret, clean_ret)
    assert (adv[~m] == 0).all() and (ret[~m] == 0).all()


def test_discounted_scan_with_powers_below_float32_range() -> None:
    """discount 0.3: past ~70 steps its powers fall below float32's normal range (they are
    dropped, not kept as slow denormals); the result still matches a plain float64 loop."""
    from rl_algos._scan import discounted_reverse_cumsum

    torch.manual_seed(0)
    x = torch.randn(4, 300)
    got = discounted_reverse_cumsum(x, 0.3)
    ref = torch.zeros(4, 300, dtype=torch.float64)
    acc = torch.zeros(4, dtype=torch.float64)
    for t in reversed(range(300)):
        acc = x[:, t].double() + 0.3 * acc
        ref[:, t] = acc
    torch.testing.assert_close(got.double(), ref, atol=1e-6, rtol=1e-6)


def test_discounted_scan_constants_made_in_inference_mode_serve_autograd() -> None:
    """The scan's cached constants, first built inside ``torch.inference_mode``, can be saved for
    backward by a later call on a tensor that requires grad."""
    from rl_algos._scan import discounted_reverse_cumsum

    with torch.inference_mode():
        discounted_reverse_cumsum(torch.ones(2, 77), 0.77)
    x = torch.ones(2, 77, requires_grad=True)
    discounted_reverse_cumsum(x, 0.77).sum().backward()
    assert x.grad is not None
    # d/dx_s of sum_t out_t = sum_{t <= s} 0.77**(s - t): 1 at s = 0
    assert x.grad[0, 0].item() == pytest.approx(1.0)
    assert x.grad[0, 2].item() == pytest.approx(1 + 0.77 + 0.77**2)
