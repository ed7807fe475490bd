"""The preference recipe's batch order: seeded epoch permutations, a function of the step."""

from __future__ import annotations

from rl_runtime.preference_step import batch_index


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
