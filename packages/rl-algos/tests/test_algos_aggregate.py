from __future__ import annotations

import pytest
import torch

from rl_algos.aggregate import aggregate, masked_mean, masked_sum, masked_var, masked_whiten

LOSS = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 5.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)


def test_hand_values_all_modes() -> None:
    # tokens: 1,2,3 | 4,5 | (empty row ignored)
    assert aggregate(LOSS, MASK, "token-mean").item() == pytest.approx(15 / 5)
    assert aggregate(LOSS, MASK, "seq-mean-token-sum").item() == pytest.approx((6 + 9) / 2)
    assert aggregate(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx((2 + 4.5) / 2)
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(
        (6 / 4 + 9 / 4) / 2
    )
    assert aggregate(
        LOSS, MASK, "seq-mean-token-sum-norm", norm_constant=3
    ).item() == pytest.approx(2.5)


def test_masked_stats_hand_values() -> None:
    assert masked_sum(LOSS, MASK).item() == 15
    assert masked_mean(LOSS, MASK).item() == 3
    torch.testing.assert_close(masked_mean(LOSS, MASK, dim=-1), torch.tensor([2.0, 4.5, 0.0]))
    # values 1..5 -> unbiased var 2.5
    assert masked_var(LOSS, MASK).item() == pytest.approx(2.5)
    w = masked_whiten(LOSS, MASK)
    expect = (torch.tensor([1.0, 2, 3, 4, 5]) - 3) / (2.5 + 1e-8) ** 0.5
    torch.testing.assert_close(w[MASK], expect)
    assert (w[~MASK] == 0).all()


def test_empty_mask_is_zero_not_nan() -> None:
    empty = torch.zeros_like(MASK)
    for mode in (
        "token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    ):
        assert aggregate(LOSS, empty, mode).item() == 0.0
    assert masked_mean(LOSS, empty).item() == 0.0


def test_inf_outside_mask_does_not_leak() -> None:
    loss = LOSS.clone()
    loss[2] = float("inf")
    assert torch.isfinite(aggregate(loss, MASK, "token-mean"))


def test_unknown_mode_and_shape_errors() -> None:
    with pytest.raises(ValueError, match="loss_agg_mode"):
        aggregate(LOSS, MASK, "token-sum-ish")
    with pytest.raises(ValueError, match="mask shape"):
        masked_mean(LOSS, MASK[:, :2])


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_data_parallel_invariance(mode: str, seed: int, layout: str, make_mask) -> None:
    """Two ranks, each with its half and the global counts, sum to the single-process value,
    in value and in gradient."""
    torch.manual_seed(seed)
    mask = make_mask(8, 12, seed, layout)
    loss = torch.randn(8, 12, dtype=torch.float64, requires_grad=True)
    whole = aggregate(loss, mask, mode)
    (g_whole,) = torch.autograd.grad(whole, loss)
    tokens = mask.sum()
    seqs = (mask.sum(-1) > 0).sum()
    halves = []
    for part in (slice(0, 4), slice(4, 8)):
        halves.append(
            aggregate(
                loss[part],
                mask[part],
                mode,
                global_token_count=tokens,
                global_seq_count=seqs,
                norm_constant=12,
            )
        )
    total = halves[0] + halves[1]
    (g_split,) = torch.autograd.grad(total, loss)
    torch.testing.assert_close(total, whole)
    torch.testing.assert_close(g_split, g_whole)
    # backends that average over ranks: world_size scaling makes the mean equal the whole
    avg = (
        sum(
            aggregate(
                loss[p],
                mask[p],
                mode,
                global_token_count=tokens,
                global_seq_count=seqs,
                world_size=2,
            )
            for p in (slice(0, 4), slice(4, 8))
        )
        / 2
    )
    torch.testing.assert_close(avg, whole)
