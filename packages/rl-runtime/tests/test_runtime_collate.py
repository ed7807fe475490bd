import pytest
import torch

from rl_config.records import Trajectory, Turn
from rl_runtime.step.collate import collate_trajectories


def _traj(tid, group, prompt, turns, reward=1.0, success=True):
    """turns: list of (model_tokens, env_tokens, turn_reward)."""
    ids = list(prompt)
    mask = [False] * len(prompt)
    lps = [0.0] * len(prompt)
    recs = []
    for k, (model, env, r) in enumerate(turns):
        start = len(ids)
        ids += model
        mask += [True] * len(model)
        lps += [-0.1 * (j + 1) for j in range(len(model))]
        recs.append(Turn(turn_idx=k, start=start, end=len(ids), reward=r))
        ids += env
        mask += [False] * len(env)
        lps += [0.0] * len(env)
    return Trajectory(
        traj_id=tid,
        group_id=group,
        tag="FrozenLake",
        env_seed=0,
        token_ids=ids,
        prompt_length=len(prompt),
        response_mask=mask,
        rollout_log_probs=lps,
        turns=recs,
        episode_reward=reward,
        success=success,
        weight_version=3,
    )


def test_collate_right_pads_and_aligns():
    a = _traj("a", "g0", [1, 2, 3], [([10, 11], [20], 0.5), ([12], [], 1.0)])
    b = _traj("b", "g1", [1, 2], [([13], [], -0.2)], reward=-0.2, success=False)
    out = collate_trajectories([a, b], pad_token_id=0)
    t = out.tensors
    assert t["input_ids"].tolist() == [[1, 2, 3, 10, 11, 20, 12], [1, 2, 13, 0, 0, 0, 0]]
    assert t["attention_mask"].tolist() == [[1] * 7, [1, 1, 1, 0, 0, 0, 0]]
    assert t["response_mask"].tolist() == [
        [False, False, False, True, True, False, True],
        [False, False, True, False, False, False, False],
    ]
    # log-probs aligned with their tokens, zero elsewhere
    assert torch.allclose(t["rollout_log_probs"][0], torch.tensor([0, 0, 0, -0.1, -0.2, 0, -0.1]))
    # each turn's reward on its last model token
    assert t["rewards"][0].tolist() == [0, 0, 0, 0, 0.5, 0, 1.0]
    assert t["rewards"][1].tolist() == pytest.approx([0, 0, -0.2, 0, 0, 0, 0])
    assert t["turn_index"][0].tolist() == [-1, -1, -1, 0, 0, -1, 1]
    assert t["group_index"].tolist() == [0, 1]
    assert t["episode_rewards"].tolist() == pytest.approx([1.0, -0.2])
    assert t["success"].tolist() == [1.0, 0.0]
    assert t["weight_version"].tolist() == [3, 3]
    assert out.group_ids == ["g0", "g1"] and out.num_truncated == 0


def test_collate_groups_share_dense_index_and_padding_multiple():
    trajs = [_traj(str(i), f"g{i // 2}", [1], [([5], [], 0.0)]) for i in range(4)]
    out = collate_trajectories(trajs, pad_token_id=9, pad_to_multiple_of=4)
    assert out.tensors["group_index"].tolist() == [0, 0, 1, 1]
    assert out.tensors["input_ids"].shape == (4, 4)
    assert out.tensors["input_ids"][0].tolist() == [1, 5, 9, 9]


def test_collate_truncation_keeps_cut_turn_reward():
    a = _traj("a", "g", [1, 2], [([3, 4], [7, 7], 0.0), ([5, 6], [], 2.0)])
    out = collate_trajectories([a], pad_token_id=0, max_length=5)
    t = out.tensors
    assert out.num_truncated == 1
    assert t["input_ids"].tolist() == [[1, 2, 3, 4, 7]]
    assert t["response_mask"][0].tolist() == [False, False, True, True, False]
    # the second turn was cut entirely: its reward lands on the last kept model token
    assert t["rewards"][0].tolist() == [0, 0, 0, 2.0, 0]


def test_collate_rejects_empty():
    with pytest.raises(ValueError, match="no trajectories"):
        collate_trajectories([], pad_token_id=0)


def test_collate_carries_baseline_rewards_in_row_order_all_or_none():
    trajs = [_traj(str(i), "g", [1], [([5], [], 0.0)]) for i in range(3)]
    assert "baseline_rewards" not in collate_trajectories(trajs, pad_token_id=0).tensors
    for t, b in zip(trajs, [0.5, -1.0, 2.0]):
        t.baseline_reward = b
    out = collate_trajectories(trajs[::-1], pad_token_id=0)
    assert out.tensors["baseline_rewards"].tolist() == [2.0, -1.0, 0.5]
    trajs[1].baseline_reward = None
    with pytest.raises(ValueError, match=r"1 of 3 trajectories have no baseline_reward.*'1'"):
        collate_trajectories(trajs, pad_token_id=0)


def test_trajectory_refuses_a_non_finite_baseline_reward():
    with pytest.raises(ValueError, match="baseline_reward is nan"):
        Trajectory(traj_id="t", group_id="g", tag="x", env_seed=0, token_ids=[1],
                   prompt_length=1, response_mask=[False], rollout_log_probs=[0.0],
                   baseline_reward=float("nan"))  # fmt: skip


def _loop_collate(trajectories, *, pad_token_id, max_length=None, pad_to_multiple_of=1):
    """The plain per-row loop collate_trajectories vectorises (its code before 2026-11-25):
    the reference the equivalence test holds it to."""
    lengths = [len(t.token_ids) for t in trajectories]
    kept = [min(n, max_length) if max_length else n for n in lengths]
    width = max(kept)
    if pad_to_multiple_of > 1:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    b = len(trajectories)
    out = {
        "input_ids": torch.full((b, width), pad_token_id, dtype=torch.long),
        "attention_mask": torch.zeros((b, width), dtype=torch.long),
        "response_mask": torch.zeros((b, width), dtype=torch.bool),
        "rollout_log_probs": torch.zeros((b, width), dtype=torch.float32),
        "rewards": torch.zeros((b, width), dtype=torch.float32),
        "turn_index": torch.full((b, width), -1, dtype=torch.long),
    }
    spans_all = []
    for i, traj in enumerate(trajectories):
        n = kept[i]
        out["input_ids"][i, :n] = torch.tensor(traj.token_ids[:n], dtype=torch.long)
        out["attention_mask"][i, :n] = 1
        if not traj.failed:
            out["response_mask"][i, :n] = torch.tensor(traj.response_mask[:n], dtype=torch.bool)
        lp = out["rollout_log_probs"]
        lp[i, :n] = torch.tensor(traj.rollout_log_probs[:n], dtype=torch.float32)
        lp[i] = lp[i] * out["response_mask"][i]
        model_positions = out["response_mask"][i].nonzero().flatten()
        last_model = int(model_positions[-1]) if model_positions.numel() else None
        spans = []
        for turn in traj.turns:
            start, end = turn.start, min(turn.end, n)
            if end > start:
                out["turn_index"][i, start:end] = torch.where(
                    out["response_mask"][i, start:end], turn.turn_idx, -1
                )
                spans.append((start, end))
                out["rewards"][i, end - 1] += float(turn.reward)
            elif last_model is not None:
                out["rewards"][i, last_model] += float(turn.reward)
        spans_all.append(spans)
    return out, spans_all, sum(k < n for k, n in zip(kept, lengths))


@pytest.mark.parametrize("seed", range(6))
def test_collate_equals_the_plain_loop(seed):
    """Random episodes (1-4 turns with env tokens between, odd rewards that round in float32,
    failed ones, cuts by max_length that split or drop turns, a padding multiple): every tensor
    equals the per-row loop's, dtype and bits (-0.0 and 0.0 compare equal, as in training)."""
    import random

    rng = random.Random(seed)
    trajs = []
    for i in range(rng.randint(1, 12)):
        turns = [
            (
                [rng.randint(1, 99) for _ in range(rng.randint(1, 6))],
                [rng.randint(1, 99) for _ in range(rng.randint(0, 4))],
                rng.choice([0.0, 1.0, 0.1, -0.3, 1e-8, 12345.678]),
            )
            for _ in range(rng.randint(1, 4))
        ]
        t = _traj(
            str(i), f"g{i // 3}", [rng.randint(1, 99) for _ in range(rng.randint(1, 5))], turns
        )
        if rng.random() < 0.2:
            t = Trajectory(**{**{f: getattr(t, f) for f in t.__struct_fields__}, "failed": True})
        trajs.append(t)
    max_length = rng.choice([None, rng.randint(2, 12)])
    multiple = rng.choice([1, 4, 8])
    got = collate_trajectories(
        trajs, pad_token_id=0, max_length=max_length, pad_to_multiple_of=multiple
    )
    want, spans, truncated = _loop_collate(
        trajs, pad_token_id=0, max_length=max_length, pad_to_multiple_of=multiple
    )
    for key, tensor in want.items():
        assert got.tensors[key].dtype == tensor.dtype, key
        assert torch.equal(got.tensors[key], tensor), key
    assert got.turn_spans == spans and got.num_truncated == truncated


def test_rewards_on_one_token_add_up_in_float32_in_turn_order():
    """Turns cut off by max_length add their rewards onto the last kept model token, in turn
    order and float32, as the token-level float32 tensor does: 1e-8 + 1.0 is 1.0 in float32,
    so 1e-8 + 1.0 - 1.0 is 0.0 (a float64 sum would leave 1e-8)."""
    a = _traj("a", "g", [1], [([3, 4], [7], 1e-8), ([5], [], 1.0), ([6], [], -1.0)])
    got = collate_trajectories([a], pad_token_id=0, max_length=3)
    want, _, _ = _loop_collate([a], pad_token_id=0, max_length=3)
    assert got.tensors["rewards"].tolist() == [[0.0, 0.0, 0.0]]
    assert torch.equal(got.tensors["rewards"], want["rewards"])
