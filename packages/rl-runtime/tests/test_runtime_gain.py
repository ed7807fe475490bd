"""The gain of training on success rates and its standard error (summary.json's `gain *`)."""

from __future__ import annotations

import pytest

from rl_runtime.pipelines.agentic.gain import success_gains
from rl_runtime.track.gains import proportion_gain


def test_proportion_gain_by_hand():
    # se = sqrt((0.3 * 0.7 + 0.5 * 0.5) / 100) = sqrt(0.0046) = 0.067823
    g = proportion_gain(0.3, 0.5, 100)
    assert g == {"gain": 0.2, "se": pytest.approx(0.0678, abs=1e-4), "gain_in_se": 2.95, "n": 100}


def test_no_variance_gives_no_standard_error_and_no_gain_is_zero_of_them():
    """Both rates 0 (or both 1): se 0, and a gain of 0 is 0 standard errors (it was reported as
    inf: an unchanged policy read as an infinitely significant gain)."""
    assert proportion_gain(0.0, 0.0, 10) == {"gain": 0.0, "se": 0.0, "gain_in_se": 0.0, "n": 10}
    assert proportion_gain(1.0, 1.0, 10)["gain_in_se"] == 0.0
    assert proportion_gain(0.0, 1.0, 10)["gain_in_se"] == float("inf")
    assert proportion_gain(1.0, 0.0, 10)["gain_in_se"] == float("-inf")


def test_success_gains_only_for_keys_both_evaluations_have():
    before = {"val/success_rate": 0.3, "val/greedy/success_rate": 0.4}
    after = {"val/success_rate": 0.5}
    keys = ("val/success_rate", "val/greedy/success_rate")
    out = success_gains(before, after, keys, n=100)
    assert list(out) == ["gain val/success_rate"]
    assert success_gains(before, after, keys, n=0) == {}


def test_distinct_envs_give_the_cautious_standard_error():
    before, after = {"val/success_rate": 0.3}, {"val/success_rate": 0.5}
    out = success_gains(before, after, ("val/success_rate",), n=100, distinct=50)
    # at 50 distinct maps: se = sqrt(0.46 / 50) = 0.095917, 0.2 / 0.095917 = 2.085
    assert out["gain val/success_rate"]["gain_in_se"] == 2.95
    assert out["gain val/success_rate"]["gain_in_se_at_distinct"] == 2.09
    assert out["validation maps"] == {"episodes": 100, "distinct": 50}
