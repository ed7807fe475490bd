import pytest
import torch

from rl_config.records import Trajectory, Turn
from rl_runtime.collate import collate_trajectories


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
