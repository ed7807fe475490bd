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
