"""Log-probs of a top-k / top-p truncated sampling distribution: every path (naive, chunked
logits, chunked hidden states) equals a plain Python loop of the samplers' rule, hand-derived
values pin the tie and keep-at-least-one rules, and a label outside the kept set stays finite
(value and gradient)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from rl_algos.logprobs import (
    aligned_log_probs,
    log_probs_from_hidden,
    log_probs_from_logits,
    log_probs_from_logits_chunked,
    truncation_keep_mask,
)


def _loop_kept(row: list[float], top_k: int | None, top_p: float | None) -> set[int]:
    """The samplers' kept set of one row of scores (already divided by the temperature), in plain
    Python: top-k keeps every value >= the k-th largest; top-p walks the top-k distribution in
    descending order (equal values: lower id first), keeping a token while the mass before it is
    below top_p (the first always)."""
    vocab = len(row)
    kept = set(range(vocab))
    if top_k is not None and 0 < top_k < vocab:
        kth = sorted(row, reverse=True)[top_k - 1]
        kept = {i for i in kept if row[i] >= kth}
    if top_p is not None and top_p < 1.0:
        norm = sum(math.exp(row[i]) for i in kept)
        order = sorted(kept, key=lambda i: (-row[i], i))
        mass, nucleus = 0.0, set()
        for i in order:
            if mass >= top_p and nucleus:
                break
            nucleus.add(i)
            mass += math.exp(row[i]) / norm
        kept = nucleus
    return kept


def _loop_log_prob_and_entropy(
    logits: list[float], label: int, temperature: float, top_k: int | None, top_p: float | None
) -> tuple[float, float]:
    row = [x / temperature for x in logits]
    kept = _loop_kept(row, top_k, top_p) | {label}
    lse = math.log(sum(math.exp(row[i]) for i in kept))
    entropy = -sum(math.exp(row[i] - lse) * (row[i] - lse) for i in kept)
    return row[label] - lse, entropy


SETTINGS = [
    (1.0, 3, None),
    (0.7, None, 0.8),
    (0.8, 5, 0.9),
    (1.3, 2, 0.5),
    (1.0, 100, None),  # top_k above the vocabulary: off
    (0.9, None, 1.0),  # top_p 1: off
]


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), SETTINGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_every_path_equals_a_plain_loop(temperature, top_k, top_p, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    n, hidden, vocab = 12, 6, 17
    h = torch.randn(n, hidden, generator=g, dtype=torch.float64)
    w = torch.randn(vocab, hidden, generator=g, dtype=torch.float64)
    logits = h @ w.t()
    # half the labels drawn from the truncated distribution, half anywhere (often outside it)
    labels = torch.randint(0, vocab, (n,), generator=g)
    expected = [
        _loop_log_prob_and_entropy(logits[i].tolist(), int(labels[i]), temperature, top_k, top_p)
        for i in range(n)
    ]
    lp_ref = torch.tensor([e[0] for e in expected], dtype=torch.float64)
    ent_ref = torch.tensor([e[1] for e in expected], dtype=torch.float64)
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    naive = log_probs_from_logits(logits, labels, temperature, top_k=top_k, top_p=top_p)
    chunked, ent_c = log_probs_from_logits_chunked(logits, labels, chunk_size=5, with_entropy=True, **kw)  # fmt: skip
    fused, ent_h = log_probs_from_hidden(h, w, labels, 4, with_entropy=True, **kw)
    for got in (naive, chunked, fused):
        torch.testing.assert_close(got, lp_ref, atol=1e-10, rtol=1e-10)
    for got in (ent_c, ent_h):
        assert got is not None
        torch.testing.assert_close(got, ent_ref, atol=1e-10, rtol=1e-10)


def test_hand_derived_values() -> None:
    e = math.e
    # top-k 2 over [2, 1, 1, 0]: the tie with the 2nd value is kept, so {0, 1, 2}
    tie = torch.tensor([[2.0, 1.0, 1.0, 0.0]] * 2)
    lp = log_probs_from_logits(tie, torch.tensor([0, 2]), top_k=2)
    torch.testing.assert_close(lp, torch.tensor([2 - math.log(e**2 + 2 * e), 1 - math.log(e**2 + 2 * e)]))  # fmt: skip
    # a label outside the set joins it: token 3 renormalised over {0, 1, 2, 3}
    lp = log_probs_from_logits(tie[:1], torch.tensor([3]), top_k=2)
    torch.testing.assert_close(lp, torch.tensor([-math.log(e**2 + 2 * e + 1)]))
    # top-p 0.5 over a uniform 4: masses before are 0, .25, .5, .75 in id order (stable), so
    # {0, 1} (1/2 each); a label outside it (2) joins: 1/3
    flat = torch.zeros(3, 4)
    lp, ent = log_probs_from_logits_chunked(
        flat, torch.tensor([1, 2, 0]), top_p=0.5, with_entropy=True, chunk_size=2
    )
    torch.testing.assert_close(lp, torch.log(torch.tensor([1 / 2, 1 / 3, 1 / 2])))
    assert ent is not None
    torch.testing.assert_close(ent, torch.log(torch.tensor([2.0, 3.0, 2.0])))
    mask = truncation_keep_mask(flat[:1], None, 0.5)
    assert mask.tolist() == [[True, True, False, False]]
    # keep at least one: a tiny top_p keeps the argmax alone, log-prob exactly 0
    peaked = torch.tensor([[0.5, 3.0, 1.0]])
    assert log_probs_from_logits(peaked, torch.tensor([1]), top_p=1e-6).item() == 0.0
    # top_k >= V and top_p = 1 change nothing
    g = torch.Generator().manual_seed(3)
    logits, labels = torch.randn(4, 9, generator=g), torch.randint(0, 9, (4,), generator=g)
    plain = torch.log_softmax(logits / 0.6, -1).gather(-1, labels[:, None])[:, 0]
    for top_k, top_p in [(9, None), (50, None), (None, 1.0), (9, 1.0)]:
        got, _ = log_probs_from_logits_chunked(logits, labels, temperature=0.6, top_k=top_k, top_p=top_p)  # fmt: skip
        torch.testing.assert_close(got, plain)


def test_temperature_is_applied_before_truncation() -> None:
    """The top-p set depends on the temperature: at T=1 [1, 0, 0] has p(0) = e/(e+2) = 0.576 < 0.6
    (two tokens kept: 0 and 1); at T=0.25 p(0) = 0.96 (token 0 alone)."""
    logits = torch.tensor([[1.0, 0.0, 0.0]])
    assert truncation_keep_mask(logits, None, 0.6).tolist() == [[True, True, False]]
    assert truncation_keep_mask(logits / 0.25, None, 0.6).tolist() == [[True, False, False]]
    assert log_probs_from_logits(logits, torch.tensor([0]), 0.25, top_p=0.6).item() == 0.0


def test_gradient_is_finite_and_exact_for_labels_outside_the_set() -> None:
    """Labels mostly outside a top-2 / top-p 0.7 set: the log-prob of the renormalised set plus
    the label, finite; the gradients (log-prob and entropy terms, logits and hidden paths) equal
    float64 autograd through an explicit mask and pass gradcheck."""
    g = torch.Generator().manual_seed(5)
    n, hidden, vocab = 8, 5, 13
    h = torch.randn(n, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(vocab, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, vocab, (n,), generator=g)
    labels[0] = -1  # an ignored position: 0, no gradient
    kw: dict[str, Any] = dict(temperature=0.9, top_k=2, top_p=0.7)
    logits = h @ w.t()
    kept = truncation_keep_mask(logits.detach() / 0.9, 2, 0.7, keep=labels.clamp(min=0))
    assert (~kept.gather(-1, labels.clamp(min=0)[:, None])).sum() == 0
    outside = ~truncation_keep_mask(logits.detach() / 0.9, 2, 0.7).gather(-1, labels[:, None].clamp(min=0))  # fmt: skip
    assert outside[1:].sum() >= 3  # the case under test happens
    masked = (logits / 0.9).masked_fill(~kept, float("-inf"))
    logp = torch.log_softmax(masked, -1)
    ref_lp = torch.where(labels >= 0, logp.gather(-1, labels.clamp(min=0)[:, None])[:, 0], 0.0)
    p = logp.exp()
    ref_ent = torch.where(labels >= 0, -(p * logp.masked_fill(~kept, 0.0)).sum(-1), 0.0)
    coef = torch.randn(n, generator=g, dtype=torch.float64)
    (ref_lp * coef + 3.0 * ref_ent).sum().backward()
    ref_gh, ref_gw = h.grad.clone(), w.grad.clone()  # type: ignore[union-attr]
    h.grad, w.grad = None, None
    lp, ent = log_probs_from_hidden(h, w, labels, 3, with_entropy=True, **kw)
    assert ent is not None and torch.isfinite(lp).all() and torch.isfinite(ent).all()
    torch.testing.assert_close(lp, ref_lp.detach())
    (lp * coef + 3.0 * ent).sum().backward()
    torch.testing.assert_close(h.grad, ref_gh)
    torch.testing.assert_close(w.grad, ref_gw)
    z = logits.detach().requires_grad_(True)
    lpz, entz = log_probs_from_logits_chunked(z, labels, chunk_size=3, with_entropy=True, **kw)
    assert entz is not None
    (lpz * coef + 3.0 * entz).sum().backward()
    assert z.grad is not None and torch.isfinite(z.grad).all()
    assert (z.grad[~kept] == 0).all()  # dropped logits get no gradient
    torch.autograd.gradcheck(
        lambda x: log_probs_from_logits_chunked(x, labels, chunk_size=3, with_entropy=True, **kw),
        (logits.detach().requires_grad_(True),),
    )


def test_aligned_log_probs_truncate_too() -> None:
    g = torch.Generator().manual_seed(2)
    logits, ids = torch.randn(2, 5, 11, generator=g), torch.randint(0, 11, (2, 5), generator=g)
    lp, _ = aligned_log_probs(logits, ids, temperature=0.8, top_k=3, top_p=0.9)
    for b in range(2):
        for t in range(1, 5):
            ref, _ = _loop_log_prob_and_entropy(logits[b, t - 1].tolist(), int(ids[b, t]), 0.8, 3, 0.9)  # fmt: skip
            assert lp[b, t].item() == pytest.approx(ref, abs=1e-5)
    assert (lp[:, 0] == 0).all()


def test_bad_truncation_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="top_p"):
        log_probs_from_logits_chunked(torch.zeros(1, 3), torch.zeros(1, dtype=torch.long), top_p=0.0)  # fmt: skip
