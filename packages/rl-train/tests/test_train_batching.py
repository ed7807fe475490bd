import itertools
import random

import pytest
import torch

from rl_train import batching
from rl_train.core import equalize_count
from rl_train.testing import make_batch


def test_token_budget_groups_respect_budget_and_cover_rows():
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 20))]
        budget = rng.randint(20, 120)
        for padded in (False, True):
            groups = batching.token_budget_groups(lengths, budget, padded=padded)
            flat = sorted(itertools.chain.from_iterable(groups))
            assert flat == list(range(len(lengths)))
            for g in groups:
                cost = len(g) * max(lengths[i] for i in g) if padded else sum(lengths[i] for i in g)
                assert cost <= budget or len(g) == 1
                assert g == sorted(g)


def test_token_budget_groups_example():
    # FFD by hand: sorted 9,6,5,3,2 ; budget 11 -> [9,2], [6,5], [3]
    assert batching.token_budget_groups([3, 9, 5, 6, 2], 11, padded=False) == [[0], [1, 4], [2, 3]]


def test_pack_unpack_roundtrip_and_positions():
    batch = make_batch(5, 12, seed=3)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    packed, pos, layout = batching.pack(ids, mask)
    assert packed.shape == (1, int(mask.sum()))
    lengths = mask.sum(-1).tolist()
    expected_pos = torch.cat([torch.arange(n) for n in lengths])
    assert torch.equal(pos[0], expected_pos)
    assert torch.equal(batching.unpack(packed, layout), ids * mask)
    assert layout.cu_seqlens.tolist() == [0, *itertools.accumulate(lengths)]


def test_pack_rejects_left_padding():
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    with pytest.raises(ValueError, match="row 1 is not right-padded"):
        batching.pack(torch.ones(2, 3, dtype=torch.long), mask)


def test_split_and_trim():
    batch = make_batch(7, 16, seed=1)
    minis = batching.split_mini_batches(batch, 3)
    assert [batching.batch_size(m) for m in minis] == [3, 3, 1]
    assert torch.equal(torch.cat([m["input_ids"] for m in minis]), batch["input_ids"])
    short = {k: v.clone() for k, v in batch.items()}
    short["attention_mask"][:, 10:] = 0
    trimmed = batching.trim_padding(short)
    assert trimmed["input_ids"].shape[1] == 10
    assert batching.padding_fraction([batch], packed=True) == 0.0
    frac = batching.padding_fraction([batch], packed=False)
    assert frac == pytest.approx(
        1 - batch["attention_mask"].sum().item() / batch["input_ids"].numel()
    )


def test_concat_undoes_a_split_and_keeps_other_entries():
    batch = {**make_batch(7, 16, seed=1), "note": "kept", "scale": torch.tensor(2.0)}
    order = torch.randperm(7, generator=torch.Generator().manual_seed(0))
    parts = [batching.select(batch, order[i : i + 3]) for i in (0, 3, 6)]
    joined = batching.concat(parts)
    for key in ("input_ids", "attention_mask", "response_mask", "advantages"):
        assert torch.equal(joined[key], batch[key][order]), key
    assert joined["note"] == "kept" and torch.equal(joined["scale"], torch.tensor(2.0))
    with pytest.raises(ValueError, match="at least one batch"):
        batching.concat([])


def test_equalize_count_splits_then_pads():
    batch = make_batch(4, 8)
    pairs = equalize_count([batch], 3)
    assert len(pairs) == 3
    assert sorted(batching.batch_size(m) for m, _ in pairs) == [1, 1, 2]
    assert torch.equal(torch.cat([m["input_ids"] for m, _ in pairs]), batch["input_ids"])
    assert all(c for _, c in pairs)
    one = batching.select(batch, [0])
    pairs = equalize_count([one], 2)
    assert [c for _, c in pairs] == [True, False]
