from __future__ import annotations

import math

import pytest
import torch

from rl_algos import correction
from rl_algos.losses import ppo_clip

LN = math.log
OLD = torch.tensor([[LN(0.5), LN(0.9), 0.0], [LN(0.2), LN(0.2), 0.0]])
ROLL = torch.tensor([[LN(0.25), LN(0.9), 0.0], [LN(0.4), LN(0.8), 0.0]])  # ratios 2, 1 | .5, .25
MASK = torch.tensor([[True, True, False], [True, True, False]])


def test_truncated_is_token_sequence_geometric() -> None:
    tok = correction.truncated_is(OLD, ROLL, MASK, level="token", threshold=1.5)
    torch.testing.assert_close(tok.weights, torch.tensor([[1.5, 1.0, 0.0], [0.5, 0.25, 0.0]]))
    assert tok.stats["is_truncated_frac"].item() == pytest.approx(0.25)
    seq = correction.truncated_is(OLD, ROLL, MASK, level="sequence", threshold=5.0)
    torch.testing.assert_close(seq.weights, torch.tensor([[2.0, 2.0, 0.0], [0.125, 0.125, 0.0]]))
    geo = correction.truncated_is(OLD, ROLL, MASK, level="geometric", threshold=5.0)
    torch.testing.assert_close(
        geo.weights, torch.tensor([[2**0.5, 2**0.5, 0.0], [0.125**0.5, 0.125**0.5, 0.0]])
    )
    with pytest.raises(ValueError, match="level"):
        correction.truncated_is(OLD, ROLL, MASK, level="segment")


def test_masked_is() -> None:
    out = correction.masked_is(OLD, ROLL, MASK, low=0.4, high=1.5)
    assert out.mask.tolist() == [[False, True, False], [True, False, False]]
    assert out.stats["is_masked_frac"].item() == pytest.approx(0.5)
    seq = correction.masked_is(OLD, ROLL, MASK, level="sequence", low=0.5, high=3.0)
    assert seq.mask.tolist() == [[True, True, False], [False, False, False]]


def test_mismatch_metrics_hand_values() -> None:
    m = correction.mismatch_metrics(OLD, ROLL, MASK)
    lrs = [LN(2), 0.0, LN(0.5), LN(0.25)]
    assert m["mismatch_k1"].item() == pytest.approx(-sum(lrs) / 4, rel=1e-5)
    assert m["mismatch_k3"].item() == pytest.approx(
        sum(math.exp(x) - x - 1 for x in lrs) / 4, rel=1e-5
    )
    assert m["mismatch_max_ratio"].item() == pytest.approx(2.0)
    assert m["mismatch_min_ratio"].item() == pytest.approx(0.25)
    assert m["mismatch_seq_max_abs_log_ratio"].item() == pytest.approx(LN(8), rel=1e-5)
    assert all(not v.requires_grad for v in m.values())


def test_weights_plug_into_policy_loss() -> None:
    tis = correction.truncated_is(OLD, ROLL, MASK, threshold=1.5)
    adv = torch.ones(2, 3)
    plain = ppo_clip(OLD, OLD, adv, MASK).loss_mat
    weighted = ppo_clip(OLD, OLD, adv, tis.mask, is_weights=tis.weights).loss_mat
    torch.testing.assert_close(weighted, plain * tis.weights)
