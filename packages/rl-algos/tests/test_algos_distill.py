"""On-policy distillation math: reverse KL by hand, teacher routing and averaging, and the
advantages against a plain loop."""

from __future__ import annotations

import math

import pytest
import torch

from rl_algos.distill import (
    average_teachers,
    combine_teachers,
    distill_advantages,
    reverse_kl_loss,
    reverse_kl_per_token,
    route_teachers,
)


def test_reverse_kl_by_hand() -> None:
    # one row: a prompt token (masked out), two sampled tokens, one pad
    # token 1: student p=0.5, teacher p=0.25 -> ln 2; token 2: student 0.2, teacher 0.8 -> -ln 4
    s = torch.log(torch.tensor([[0.9, 0.5, 0.2, 0.3]]))
    t = torch.log(torch.tensor([[0.1, 0.25, 0.8, 0.6]]))
    mask = torch.tensor([[False, True, True, False]])
    kl = reverse_kl_per_token(s, t, mask)
    torch.testing.assert_close(kl, torch.tensor([[0.0, math.log(2), -math.log(4), 0.0]]))
    torch.testing.assert_close(reverse_kl_loss(s, t, mask), torch.tensor(-math.log(2) / 2))
    adv = distill_advantages(s, t, mask, kl_coef=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.0, -0.5 * math.log(2), math.log(2), 0.0]]))


def test_expected_single_sample_kl_is_the_reverse_kl() -> None:
    # student [0.5, 0.5], teacher [0.25, 0.75] over a 2-token vocabulary: KL(s || t) =
    # 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 ln 2 + 0.5 ln(2/3) = 0.14384
    ps, pt = torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75])
    kl = reverse_kl_per_token(ps.log()[None], pt.log()[None], torch.ones(1, 2, dtype=torch.bool))
    expected = (ps * kl[0]).sum()
    torch.testing.assert_close(expected, torch.tensor(0.5 * math.log(2) + 0.5 * math.log(2 / 3)))
    assert abs(float(expected) - 0.14384) < 1e-4


def test_route_and_average_by_hand() -> None:
    lp = torch.tensor([[[-1.0, -2.0], [-3.0, -4.0]], [[-5.0, -6.0], [-7.0, -8.0]]])  # [K=2,B=2,T=2]
    torch.testing.assert_close(
        route_teachers(lp, torch.tensor([1, 0])), torch.tensor([[-5.0, -6.0], [-3.0, -4.0]])
    )
    torch.testing.assert_close(average_teachers(lp), torch.tensor([[-3.0, -4.0], [-5.0, -6.0]]))
    torch.testing.assert_close(
        average_teachers(lp, torch.tensor([3.0, 1.0])),
        torch.tensor([[-2.0, -3.0], [-4.0, -5.0]]),
    )
    with pytest.raises(ValueError, match="out of range"):
        route_teachers(lp, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="non-negative"):
        average_teachers(lp, torch.tensor([1.0, -1.0]))


def test_advantages_equal_a_plain_loop() -> None:
    g = torch.Generator().manual_seed(0)
    k, b, t = 3, 5, 7
    teachers = -torch.rand(k, b, t, generator=g) * 3
    student = -torch.rand(b, t, generator=g) * 3
    mask = torch.rand(b, t, generator=g) > 0.3
    index = torch.tensor([2, 0, 1, 1, 0])
    coef = torch.tensor([0.5, 1.0, 2.0])[index]
    got = distill_advantages(student, route_teachers(teachers, index), mask, coef)
    want = torch.zeros(b, t)
    for row in range(b):
        for pos in range(t):
            if mask[row, pos]:
                kl = float(student[row, pos]) - float(teachers[index[row], row, pos])
                want[row, pos] = -float(coef[row]) * kl
    torch.testing.assert_close(got, want)


def test_shapes_must_agree() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        reverse_kl_per_token(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))


def test_combined_teachers_equal_rolls_sum_of_weighted_kls() -> None:
    """ROLL adds each covering teacher's `kl_coef * (student - teacher)`; the mixture gives the
    same advantages (plain loop), routing and averaging as special cases."""
    g = torch.Generator().manual_seed(1)
    k, b, t = 3, 4, 5
    teachers = -torch.rand(k, b, t, generator=g) * 2
    student = -torch.rand(b, t, generator=g) * 2
    mask = torch.rand(b, t, generator=g) > 0.2
    coefs = torch.tensor([[1.0, 0.0, 0.5, 0.0], [0.0, 2.0, 0.5, 0.0], [0.0, 0.0, 1.0, 0.0]])
    mixed, total = combine_teachers(teachers, coefs)
    got = distill_advantages(student, mixed, mask, total)
    want = torch.zeros(b, t)
    for row in range(b):
        for pos in range(t):
            if mask[row, pos]:
                for i in range(k):
                    kl = float(student[row, pos]) - float(teachers[i, row, pos])
                    want[row, pos] -= float(coefs[i, row]) * kl
    torch.testing.assert_close(got, want)
    assert total.tolist() == [1.0, 2.0, 2.0, 0.0]
    # routing: one teacher per row
    onehot = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    index = torch.tensor([0, 1, 2, 0])
    torch.testing.assert_close(
        combine_teachers(teachers, onehot)[0], route_teachers(teachers, index)
    )
    # averaging: every teacher on every row
    torch.testing.assert_close(
        combine_teachers(teachers, torch.ones(k, b))[0], average_teachers(teachers)
    )


# --- off-policy, token-level distillation (teacher_topk, kd_divergence, kd_loss) ----------------

# teacher p = (1/2, 1/2) (logits 0, 0); student q = (1/4, 3/4) (logits 0, ln 3). By hand:
#   forward  KL(p||q) = 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3)
#   reverse  KL(q||p) = 1/4 ln(1/2) + 3/4 ln(3/2)
#   js       m = (3/8, 5/8): (1/2 ln(16/15) + 1/4 ln(2/3) + 3/4 ln(6/5)) / 2
#   skewed forward, lambda 0.1: mix = 0.1 p + 0.9 q = (0.275, 0.725): 1/2 ln(0.25 / (0.275 * 0.725))
#   skewed reverse, lambda 0.1: mix = 0.9 p + 0.1 q = (0.475, 0.525):
#                  1/4 ln(0.25 / 0.475) + 3/4 ln(0.75 / 0.525)
#   adaptive, alpha 0.5: one teacher token in the tail (cumulative 1/2 <= 1/2), one in the head,
#                  |p - q| = 1/4 in both: the mean of forward and reverse
HAND = {
    "forward_kl": 0.5 * math.log(4 / 3),
    "reverse_kl": 0.25 * math.log(0.5) + 0.75 * math.log(1.5),
    "js_divergence": (0.5 * math.log(16 / 15) + 0.25 * math.log(2 / 3) + 0.75 * math.log(1.2)) / 2,
    "skewed_forward_kl": 0.5 * math.log(0.25 / (0.275 * 0.725)),
    "skewed_reverse_kl": 0.25 * math.log(0.25 / 0.475) + 0.75 * math.log(0.75 / 0.525),
    "adaptive_kl": (0.5 * math.log(4 / 3) + 0.25 * math.log(0.5) + 0.75 * math.log(1.5)) / 2,
}


@pytest.mark.parametrize("objective", sorted(HAND))
def test_kd_divergence_hand_values(objective):
    from rl_algos.distill import KD_OBJECTIVES, kd_divergence, teacher_topk

    assert set(HAND) == set(KD_OBJECTIVES)  # every objective ROLL names has a hand value
    teacher, _ = teacher_topk(torch.tensor([[0.0, 0.0]]), k=0)
    student = torch.tensor([[0.0, math.log(3.0)]])
    got = kd_divergence(student, teacher, objective)
    assert got.shape == (1,)
    assert float(got[0]) == pytest.approx(HAND[objective], abs=1e-6)


def test_kd_divergence_zero_at_the_teacher_and_forward_gradient():
    """Every objective is 0 when the student equals the teacher; the forward KL's gradient in
    the student's logits is q - p (by hand: d/dz sum p (log p - log softmax z) = softmax z - p)."""
    from rl_algos.distill import KD_OBJECTIVES, kd_divergence, teacher_topk

    logits = torch.tensor([[0.3, -1.0, 2.0, 0.5]])
    teacher, _ = teacher_topk(logits, k=0)
    for name in KD_OBJECTIVES:
        assert float(kd_divergence(logits.clone(), teacher, name)[0]) == pytest.approx(0, abs=1e-6)
    z = torch.tensor([[0.0, math.log(3.0)]], requires_grad=True)
    p, _ = teacher_topk(torch.zeros(1, 2), k=0)
    kd_divergence(z, p, "forward_kl").sum().backward()
    assert z.grad is not None
    assert z.grad[0].tolist() == pytest.approx([0.25 - 0.5, 0.75 - 0.5], abs=1e-6)


def test_teacher_topk_renormalises_and_divides_by_temperature():
    from rl_algos.distill import teacher_topk

    lp, ids = teacher_topk(torch.tensor([[[2.0, 1.0, 0.0]]]), k=2)
    e = math.e
    assert ids.tolist() == [[[0, 1]]]
    assert lp.exp()[0, 0].tolist() == pytest.approx([e / (e + 1), 1 / (e + 1)], abs=1e-6)
    # temperature 2 on logits (0, 2 ln 3) gives softmax(0, ln 3) = (1/4, 3/4); k >= V: all ids
    lp, ids = teacher_topk(torch.tensor([[0.0, 2 * math.log(3.0)]]), k=5, temperature=2.0)
    assert ids.tolist() == [[0, 1]] and lp.exp()[0].tolist() == pytest.approx([0.25, 0.75])
    with pytest.raises(ValueError, match="k=-1"):
        teacher_topk(torch.zeros(1, 2), k=-1)


def _loop_divergence(q: list[float], p: list[float], name: str, alpha: float, lam: float) -> float:
    """One position's divergence from probabilities, term by term (the reference)."""

    def kl(a: list[float], b: list[float]) -> float:
        return sum(x * math.log(x / y) for x, y in zip(a, b, strict=True))

    if name == "forward_kl":
        return kl(p, q)
    if name == "reverse_kl":
        return kl(q, p)
    if name == "skewed_forward_kl":
        return kl(p, [lam * x + (1 - lam) * y for x, y in zip(p, q, strict=True)])
    if name == "skewed_reverse_kl":
        return kl(q, [(1 - lam) * x + lam * y for x, y in zip(p, q, strict=True)])
    if name == "js_divergence":
        m = [(x + y) / 2 for x, y in zip(p, q, strict=True)]
        return (kl(p, m) + kl(q, m)) / 2
    order = sorted(range(len(p)), key=lambda i: p[i])
    cum, head, tail = 0.0, 0.0, 0.0
    for i in order:
        cum += p[i]
        if cum <= alpha:
            tail += abs(p[i] - q[i])
        else:
            head += abs(p[i] - q[i])
    return (head * kl(p, q) + tail * kl(q, p)) / (head + tail)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kd_divergence_equals_a_plain_loop_with_topk_and_temperatures(seed):
    """Random [B, T, V] logits, teacher top-k with a temperature, every objective: the vectorised
    divergence equals the per-position loop; kd_loss is the masked token mean."""
    from rl_algos.distill import KD_OBJECTIVES, kd_divergence, kd_loss, teacher_topk

    g = torch.Generator().manual_seed(seed)
    b, t, v, k, kd_t, teach_t = 2, 3, 7, 4, 1.5, 0.8
    t_logits = torch.randn(b, t, v, generator=g, dtype=torch.float64) * 2
    s_logits = torch.randn(b, t, v, generator=g, dtype=torch.float64) * 2
    p_log, ids = teacher_topk(t_logits, k, temperature=kd_t * teach_t)
    gathered = s_logits.gather(-1, ids)
    mask = torch.tensor([[False, True, True], [True, True, False]])
    for name in KD_OBJECTIVES:
        got = kd_divergence(gathered, p_log, name, kd_temperature=kd_t, adaptive_kl_alpha=0.4,
                            skew_lambda=0.2)  # fmt: skip
        total, n = 0.0, 0
        for i in range(b):
            for j in range(t):
                top = sorted(range(v), key=lambda x: -float(t_logits[i, j, x]))[:k]
                tz = [float(t_logits[i, j, x]) / (kd_t * teach_t) for x in top]
                sz = [float(s_logits[i, j, x]) / kd_t for x in top]
                p = [math.exp(z) / sum(math.exp(y) for y in tz) for z in tz]
                q = [math.exp(z) / sum(math.exp(y) for y in sz) for z in sz]
                want = _loop_divergence(q, p, name, 0.4, 0.2)
                assert float(got[i, j]) == pytest.approx(want, rel=1e-5, abs=1e-7), (name, i, j)
                if mask[i, j]:
                    total, n = total + want, n + 1
        assert float(kd_loss(got, mask)) == pytest.approx(total / n, rel=1e-5)
        assert float(kd_loss(got, mask, token_count=2 * n)) == pytest.approx(total / (2 * n))


def test_kd_divergence_refuses_unknown_objective_and_shape_mismatch():
    from rl_algos.distill import kd_divergence

    with pytest.raises(ValueError, match="kd_objective='tv'"):
        kd_divergence(torch.zeros(1, 2), torch.zeros(1, 2), "tv")
    with pytest.raises(ValueError, match="shapes differ"):
        kd_divergence(torch.zeros(1, 2), torch.zeros(1, 3))
