"""rl_runtime.state.seeds: each stream's seed, hand-computed (a changed formula would change every run's
draws and break resuming an earlier run's checkpoint), streams kept apart, the globals seeded;
and the supervised warm-up's loss (rl_algos' SFT loss) against a hand-computed mean."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from rl_runtime.state import seeds
from rl_runtime.step.losses import sft_loss_fn
from rl_train.types import ForwardOutput, LossContext


def test_each_stream_has_its_hand_computed_seed():
    assert seeds.batch_sampling_seed(42, "train", 3) == 42 * 100_003 + 21
    assert seeds.batch_sampling_seed(42, "val", 3) == 42 * 100_003 + 22
    assert seeds.eval_seed(5) == 500_016
    assert seeds.generation_round_seed(2, 3, 4) == 200_006 + 21 + 400_000_028
    assert seeds.sample_seed(7, 2) == 7065
    assert seeds.epoch_order_seed(3, 1) == 3_000_010
    assert seeds.demo_env_seed(42) == 1_000_042
    assert seeds.engine_seed(42, 1) == 43
    assert [seeds.worker_seed(42, k, 1) for k in ("train", "rollout", "judge", "reward_model")] == [
        43, 1043, 2043, 3043,
    ]  # fmt: skip
    # blake2b, not Python's salted hash: the same in every process and every run
    assert seeds.env_seed(42, "train", 0, 0) == seeds.env_seed(42, "train", 0, 0)
    assert 0 <= seeds.env_seed(42, "train", 0, 0) < 2**31 - 1
    drawn = {
        seeds.env_seed(42, s, e, g) for s in ("train", "val") for e in range(3) for g in range(8)
    }
    assert len(drawn) == 48
    assert seeds.member_seed(7, 0) != seeds.member_seed(7, 1)


def test_seed_globals_seeds_torch_python_and_numpy():
    seeds.seed_globals(3)
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    seeds.seed_globals(3)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == first
    random.seed(3)
    assert first[0] == random.random()  # python's generator got the seed itself


def test_sft_loss_is_the_masked_nll_over_the_mini_batch_tokens():
    """Two micro-batch rows, 3 of 4 tokens imitated; the mini-batch has 6 such tokens (another
    micro-batch holds the other 3): the loss is this micro-batch's share, sum(-log p) / 6."""
    log_probs = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]], requires_grad=True)
    batch = {"response_mask": torch.tensor([[1, 1], [1, 0]])}
    ctx = LossContext(global_tokens=6.0, global_seqs=4.0, max_seq_len=2)
    loss, stats = sft_loss_fn(batch, ForwardOutput(log_probs=log_probs), ctx)
    assert float(loss) == pytest.approx((1.0 + 2.0 + 0.5) / 6, abs=1e-7)
    loss.backward()
    assert log_probs.grad is not None
    expected = torch.tensor([[-1 / 6, -1 / 6], [-1 / 6, 0.0]])
    torch.testing.assert_close(log_probs.grad, expected)
    assert float(stats["sft_nll"]) == float(loss)
