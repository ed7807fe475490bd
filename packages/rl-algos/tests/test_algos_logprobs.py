"""Chunked log-prob / entropy paths equal the naive float32 path in value and gradient."""

from __future__ import annotations

import pytest
import torch

from rl_algos.logprobs import (
    aligned_log_probs,
    entropy_from_logits,
    entropy_from_logits_chunked,
    log_probs_from_hidden,
    log_probs_from_logits,
    log_probs_from_logits_chunked,
)


def test_hand_values() -> None:
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, float("-inf"), float("-inf")]])
    lp = log_probs_from_logits(logits, torch.tensor([1, 0]))
    torch.testing.assert_close(lp, torch.log(torch.tensor([0.25, 0.5])))
    ent = entropy_from_logits(torch.zeros(1, 4))
    torch.testing.assert_close(ent, torch.log(torch.tensor([4.0])))
    lp_c, ent_c = log_probs_from_logits_chunked(
        torch.zeros(3, 4), torch.tensor([0, 1, 2]), chunk_size=2, with_entropy=True
    )
    torch.testing.assert_close(lp_c, torch.full((3,), -torch.log(torch.tensor(4.0)).item()))
    assert ent_c is not None
    torch.testing.assert_close(ent_c, torch.full((3,), torch.log(torch.tensor(4.0)).item()))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logits_equal_naive_value_and_grad(
    seed: int, chunk: int, temperature: float
) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(2, 5, 33, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    labels = torch.randint(0, 33, (2, 5), generator=g)
    labels[1, 4] = -100  # ignored
    w_lp, w_ent = (
        torch.randn(2, 5, generator=g, dtype=torch.float64),
        torch.randn(2, 5, generator=g, dtype=torch.float64),
    )

    lp_n = log_probs_from_logits(logits, labels, temperature)
    ent_n = entropy_from_logits(logits, temperature) * (labels >= 0)
    (g_n,) = torch.autograd.grad((lp_n * w_lp).sum() + (ent_n * w_ent).sum(), logits)
    lp_c, ent_c = log_probs_from_logits_chunked(
        logits, labels, chunk_size=chunk, temperature=temperature, with_entropy=True
    )
    assert ent_c is not None
    (g_c,) = torch.autograd.grad((lp_c * w_lp).sum() + (ent_c * w_ent).sum(), logits)
    torch.testing.assert_close(lp_c, lp_n)
    torch.testing.assert_close(ent_c, ent_n)
    torch.testing.assert_close(g_c, g_n)
    # log-prob only and entropy only
    (g1,) = torch.autograd.grad(
        (
            log_probs_from_logits_chunked(
                logits, labels, chunk_size=chunk, temperature=temperature
            )[0]
            * w_lp
        ).sum(),
        logits,
    )
    (g1n,) = torch.autograd.grad(
        (log_probs_from_logits(logits, labels, temperature) * w_lp).sum(), logits
    )
    torch.testing.assert_close(g1, g1n)
    e_only = entropy_from_logits_chunked(logits, chunk_size=chunk, temperature=temperature)
    (g2,) = torch.autograd.grad((e_only * w_ent).sum(), logits)
    (g2n,) = torch.autograd.grad((entropy_from_logits(logits, temperature) * w_ent).sum(), logits)
    torch.testing.assert_close(g2, g2n)


def test_chunked_gradcheck() -> None:
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 5, -1, 2])

    def f(x):
        lp, ent = log_probs_from_logits_chunked(x, labels, chunk_size=3, with_entropy=True)
        assert ent is not None
        return lp, ent

    assert torch.autograd.gradcheck(f, (logits,))


def test_bf16_logits_are_computed_in_float32() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 1000, generator=g).bfloat16()
    labels = torch.randint(0, 1000, (8,), generator=g)
    lp, ent = log_probs_from_logits_chunked(logits, labels, chunk_size=3, with_entropy=True)
    assert lp.dtype == torch.float32 and ent is not None
    torch.testing.assert_close(lp, log_probs_from_logits(logits, labels))
    torch.testing.assert_close(ent, entropy_from_logits(logits))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("chunk", [2, 5, 64])
def test_from_hidden_equals_naive(seed: int, chunk: int) -> None:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, 4, 8, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(29, 8, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 29, (3, 4), generator=g)
    labels[0, 0] = -1
    w1, w2 = (
        torch.randn(3, 4, generator=g, dtype=torch.float64),
        torch.randn(3, 4, generator=g, dtype=torch.float64),
    )
    logits = hidden @ weight.t()
    naive = (log_probs_from_logits(logits, labels) * w1).sum() + (
        entropy_from_logits(logits) * (labels >= 0) * w2
    ).sum()
    gh_n, gw_n = torch.autograd.grad(naive, (hidden, weight))
    lp, ent = log_probs_from_hidden(hidden, weight, labels, chunk, with_entropy=True)
    assert ent is not None
    gh_c, gw_c = torch.autograd.grad((lp * w1).sum() + (ent * w2).sum(), (hidden, weight))
    torch.testing.assert_close(lp, log_probs_from_logits(logits, labels))
    torch.testing.assert_close(gh_c, gh_n)
    torch.testing.assert_close(gw_c, gw_n)


def test_from_hidden_gradcheck_and_frozen_head() -> None:
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(9, 4, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 9, (5,), generator=g)
    assert torch.autograd.gradcheck(
        lambda h, w: log_probs_from_hidden(h, w, labels, 2, with_entropy=True), (hidden, weight)
    )
    lp, _ = log_probs_from_hidden(hidden, weight.detach(), labels, 2)
    lp.sum().backward()
    assert hidden.grad is not None
    with pytest.raises(ValueError, match="lm_head_weight"):
        log_probs_from_hidden(hidden, weight[:, :3], labels)


def test_aligned_log_probs_follow_contract() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g)
    ids = torch.randint(0, 11, (2, 5), generator=g)
    lp, ent = aligned_log_probs(logits, ids, with_entropy=True, chunk_size=3)
    assert ent is not None
    assert (lp[:, 0] == 0).all()
    for b in range(2):
        for t in range(1, 5):
            expect = torch.log_softmax(logits[b, t - 1], -1)[ids[b, t]]
            torch.testing.assert_close(lp[b, t], expect)
            torch.testing.assert_close(ent[b, t], entropy_from_logits(logits[b, t - 1]))
