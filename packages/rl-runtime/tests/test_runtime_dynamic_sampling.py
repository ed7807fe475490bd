"""DAPO dynamic sampling's refill loop: zero-variance groups dropped, the batch refilled with
the missing count only, bounded by max_extra_rounds."""

from __future__ import annotations

import pytest

from rl_runtime.pipelines.rlvr.dynamic_sampling import fill_groups, has_signal


class Source:
    """Hands out groups (lists of rewards) in a fixed order; records each request size."""

    def __init__(self, groups: list[list[float]]) -> None:
        self.groups = list(groups)
        self.asked: list[int] = []

    def __call__(self, k: int) -> list[list[float]]:
        self.asked.append(k)
        out, self.groups = self.groups[:k], self.groups[k:]
        return out


FLAT, MIXED = [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]


def test_has_signal():
    assert not has_signal([0.0, 0.0])
    assert has_signal([0.0, 0.5])
    assert not has_signal([])
    assert not has_signal([0.0, 1e-9], atol=1e-6)


def test_refill_asks_for_the_missing_groups_only():
    src = Source([MIXED, FLAT, FLAT, MIXED, MIXED, FLAT, MIXED, MIXED])
    out = fill_groups(src, lambda g: g, 4, enable=True, max_extra_rounds=5)
    assert src.asked == [4, 2, 1]  # 1 kept, then 1 of 2, then the last one
    assert out.groups == [MIXED] * 4
    assert (out.rounds, out.dropped, out.generated, out.filled) == (3, 3, 7, True)
    assert out.metrics()["dynamic_sampling/dropped_groups"] == 3.0


def test_refill_stops_at_the_bound_and_returns_a_short_batch():
    src = Source([FLAT] * 20 + [MIXED])
    out = fill_groups(src, lambda g: g, 2, enable=True, max_extra_rounds=2)
    assert src.asked == [2, 2, 2]  # one round + 2 extra rounds, never more
    assert out.groups == [] and not out.filled and out.dropped == 6


def test_unbounded_refill_runs_until_full():
    src = Source([FLAT] * 9 + [MIXED, MIXED])
    out = fill_groups(src, lambda g: g, 2, enable=True, max_extra_rounds=None)
    assert out.filled and out.rounds == 6 and out.groups == [MIXED, MIXED]


def test_disabled_keeps_every_group_in_one_round():
    src = Source([FLAT, MIXED, FLAT])
    out = fill_groups(src, lambda g: g, 3, enable=False, max_extra_rounds=0)
    assert src.asked == [3] and out.groups == [FLAT, MIXED, FLAT] and out.dropped == 0


@pytest.mark.parametrize("target, bound", [(0, 1), (2, -1)])
def test_bad_arguments(target, bound):
    with pytest.raises(ValueError):
        fill_groups(Source([]), lambda g: g, target, enable=True, max_extra_rounds=bound)
