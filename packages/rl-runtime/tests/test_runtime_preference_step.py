"""The preference recipe's batch order: seeded epoch permutations, a function of the step."""

from __future__ import annotations

import torch

from rl_runtime.step.epochs import batch_index, batch_position


def test_each_epoch_is_a_permutation_consumed_in_order_and_the_partial_batch_skipped():
    n, per = 10, 3  # 3 batches per epoch; example left over each epoch
    epoch0 = [batch_index(n, per, seed=1, step=s) for s in range(3)]
    epoch1 = [batch_index(n, per, seed=1, step=s) for s in range(3, 6)]
    for epoch in (epoch0, epoch1):
        flat = [i for b in epoch for i in b]
        assert all(len(b) == per for b in epoch) and len(set(flat)) == 9
    assert epoch0 != epoch1  # a new order each epoch
    assert batch_index(n, per, seed=1, step=4) == epoch1[1]  # resumable: the step alone decides
    assert batch_index(n, per, seed=2, step=0) != epoch0[0]


def test_batch_position_names_the_epoch_whose_permutation_the_step_draws_from():
    n, per = 10, 3  # 3 whole batches per epoch: step 3 is epoch 1's first batch (not 3*3 // 10 = 0)
    assert [batch_position(n, per, s) for s in range(7)] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0),
    ]  # fmt: skip
    epoch1 = torch.randperm(n, generator=torch.Generator().manual_seed(1 * 1_000_003 + 1)).tolist()
    assert batch_index(n, per, seed=1, step=3) == epoch1[:per]
