"""The consecutive-group fast path (statistics on a [G, k] view) equals the general scatter path.

Rows laid out as rollouts emit them (the k samples of a prompt adjacent) take the dense path; the
same rows shuffled take the index_add/gather path, which the loop-equivalence tests in
test_algos_advantages.py pin down.  Un-shuffling must give the same advantages.
"""

from __future__ import annotations

import pytest
import torch

from rl_algos import advantages as A
from rl_algos._groups import consecutive_group_size, group_ids

ESTIMATORS = ["grpo", "dr_grpo", "rloo", "gpg", "opo", "reinforce_pp_baseline", "grpo_passk"]


def _batch(g: int, k: int, t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 3, (g * k,), generator=gen).double() / 2  # ties on purpose
    scores[:k] = 0.5  # one degenerate group (all equal: std 0, gpg drops it)
    lengths = torch.randint(0, t + 1, (g * k, 1), generator=gen)
    mask = torch.arange(t) < lengths  # some empty rows (length 0)
    return scores, mask, torch.arange(g * k) // k


@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize(("g", "k", "seed"), [(5, 2, 0), (7, 3, 1), (4, 8, 2), (16, 4, 3)])
def test_consecutive_layout_equals_shuffled(name: str, g: int, k: int, seed: int) -> None:
    scores, mask, index = _batch(g, k, 24, seed)
    ids, n_groups = group_ids(index, index.shape[0], index.device)
    assert consecutive_group_size(ids, n_groups) == k  # dense path taken
    perm = torch.randperm(g * k, generator=torch.Generator().manual_seed(seed + 100))
    assert consecutive_group_size(index[perm], n_groups) == 0  # general path taken
    fn = A.get_estimator(name)
    fast = fn(scores, mask, index)[0]
    general = fn(scores[perm], mask[perm], index[perm])[0]
    torch.testing.assert_close(fast[perm], general, atol=1e-12, rtol=1e-12)
    assert fast.dtype == torch.float64 and bool((fast[~mask] == 0).all())


def test_consecutive_layout_with_string_keys() -> None:
    scores, mask, index = _batch(6, 4, 10, 5)
    keys = [f"prompt-{int(i)}" for i in index]
    torch.testing.assert_close(A.grpo(scores, mask, keys)[0], A.grpo(scores, mask, index)[0])


def test_consecutive_group_size_detection() -> None:
    def size(ids: list[int]) -> int:
        t = torch.tensor(ids)
        return consecutive_group_size(t, int(t.max()) + 1)

    assert size([0, 0, 1, 1, 2, 2]) == 2
    assert size([0, 0, 0, 1, 1, 1]) == 3
    assert size([0, 1, 2]) == 0  # groups of one: general path (singleton rule)
    assert size([0, 0, 1, 1, 1, 2]) == 0  # unequal sizes
    assert size([0, 1, 0, 1]) == 0  # interleaved
    assert size([1, 1, 0, 0]) == 0  # not in first-appearance order
    assert consecutive_group_size(torch.zeros(0, dtype=torch.long), 0) == 0


def test_passk_dense_path_hand_values() -> None:
    # groups of 3 rows: [1, 3, 3] -> first 3 is best, gap 3 - 3 = 0; [2, 0, 1] -> row 3, gap 1
    scores = torch.tensor([1.0, 3.0, 3.0, 2.0, 0.0, 1.0], dtype=torch.float64)
    mask = torch.ones(6, 2, dtype=torch.bool)
    adv, _ = A.grpo_passk(scores, mask, torch.tensor([0, 0, 0, 1, 1, 1]), norm_by_std=False)
    torch.testing.assert_close(
        adv[:, 0], torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    )
    adv, _ = A.grpo_passk(scores, mask, torch.tensor([0, 0, 0, 1, 1, 1]))
    assert adv[3, 0].item() == pytest.approx(1.0 / (1.0 + 1e-6))  # std of [2, 0, 1] is 1


@pytest.mark.parametrize("t", [8, 13, 64, 2048, 2040 * 2 + 8])
def test_row_lengths_packed_count_is_exact(t: int) -> None:
    from rl_algos.advantages import _row_lengths

    gen = torch.Generator().manual_seed(t)
    mask = torch.rand(6, t, generator=gen) < 0.7
    mask[0] = False
    mask[1] = True  # a full row: every byte lane at its maximum
    for m in (mask, mask[1:], mask[:, 1:], mask.t().contiguous().t()):  # offsets, strides
        for dtype in (torch.float32, torch.float64):
            torch.testing.assert_close(_row_lengths(m, dtype), m.sum(-1).to(dtype), rtol=0, atol=0)
