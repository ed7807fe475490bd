import pytest
import torch

from rl_config.records import Trajectory, Turn
from rl_runtime.advantages import AdvantageConfig, compute_advantages, step_rows
from rl_runtime.collate import collate_trajectories


def _traj(tid, group, tag, reward, n_turns=1, obs=(7,)):
    ids, mask, turns = [1, 2], [False, False], []
    for k in range(n_turns):
        start = len(ids)
        ids += [10 + k, 11 + k]
        mask += [True, True]
        turns.append(Turn(turn_idx=k, start=start, end=len(ids), reward=reward / n_turns))
        ids += list(obs)
        mask += [False] * len(obs)
    return Trajectory(
        traj_id=tid,
        group_id=group,
        tag=tag,
        env_seed=0,
        token_ids=ids,
        prompt_length=2,
        response_mask=mask,
        rollout_log_probs=[0.0] * len(ids),
        turns=turns,
        episode_reward=reward,
        success=reward > 0,
    )


def _plain_group_norm(scores, keys, eps=1e-6):
    out = []
    for i, s in enumerate(scores):
        group = [scores[j] for j in range(len(scores)) if keys[j] == keys[i]]
        mean = sum(group) / len(group)
        std = (
            (sum((g - mean) ** 2 for g in group) / (len(group) - 1)) ** 0.5
            if len(group) > 1
            else 0.0
        )
        out.append((s - mean) / (std + eps) if len(group) > 1 else s - mean)
    return out


@pytest.mark.parametrize("grouping", ["traj_group_id", "tags", "batch"])
def test_grpo_is_group_normalised_score_on_every_model_token(grouping):
    trajs = [
        _traj("a", "g0", "A", 1.0),
        _traj("b", "g0", "A", 0.0),
        _traj("c", "g1", "B", 0.5),
        _traj("d", "g1", "A", -0.5),
    ]
    batch = collate_trajectories(trajs, pad_token_id=0)
    out = compute_advantages(batch, AdvantageConfig(adv_estimator="grpo", grouping=grouping))
    keys = {
        "traj_group_id": ["g0", "g0", "g1", "g1"],
        "tags": ["A", "A", "B", "A"],
        "batch": [0, 0, 0, 0],
    }[grouping]
    expected = _plain_group_norm([1.0, 0.0, 0.5, -0.5], keys)
    mask = batch.tensors["response_mask"]
    for b, e in enumerate(expected):
        assert torch.allclose(out["advantages"][b][mask[b]], torch.full((2,), e), atol=1e-4)
        assert out["advantages"][b][~mask[b]].abs().sum() == 0


def test_identity_whiten_and_clip():
    trajs = [_traj("a", "g", "A", 3.0), _traj("b", "g", "A", -1.0)]
    batch = collate_trajectories(trajs, pad_token_id=0)
    out = compute_advantages(
        batch, AdvantageConfig(adv_estimator="reinforce", method="identity", advantage_clip=2.0)
    )
    mask = batch.tensors["response_mask"]
    assert out["advantages"][0][mask[0]].tolist() == [2.0, 2.0]  # 3 clipped to 2
    assert out["advantages"][1][mask[1]].tolist() == [-1.0, -1.0]
    white = compute_advantages(
        batch,
        AdvantageConfig(adv_estimator="reinforce", method="identity", whiten_advantages=True),
    )
    vals = white["advantages"][mask]
    assert float(vals.mean()) == pytest.approx(0.0, abs=1e-6)


def test_gae_needs_values_and_uses_last_token_reward():
    trajs = [_traj("a", "g", "A", 1.0), _traj("b", "g", "A", 0.0)]
    batch = collate_trajectories(trajs, pad_token_id=0)
    cfg = AdvantageConfig(adv_estimator="gae", method="identity", gamma=1.0, lam=1.0)
    with pytest.raises(ValueError, match="critic"):
        compute_advantages(batch, cfg)
    values = torch.zeros(batch.tensors["input_ids"].shape)
    out = compute_advantages(batch, cfg, values=values)
    mask = batch.tensors["response_mask"]
    # zero values, gamma = lam = 1: every model token's advantage is the episode reward
    assert out["advantages"][0][mask[0]].tolist() == [1.0, 1.0]
    assert out["returns"][1][mask[1]].tolist() == [0.0, 0.0]


def test_gigpo_step_rows_and_advantages():
    # two trajectories of one group, two turns each; the first turn sees the same prompt
    trajs = [_traj("a", "g", "A", 1.0, n_turns=2), _traj("b", "g", "A", 0.0, n_turns=2, obs=(8,))]
    batch = collate_trajectories(trajs, pad_token_id=0)
    rows = step_rows(batch)
    assert rows["row_of"].tolist() == [0, 0, 1, 1]
    assert rows["step_ids"].tolist() == [0, 1, 0, 1]
    a = rows["anchor_ids"].tolist()
    assert a[0] == a[2]  # same prompt before turn 0
    assert a[1] != a[3]  # different observation before turn 1
    assert rows["step_mask"].sum(-1).tolist() == [2, 2, 2, 2]
    out = compute_advantages(batch, AdvantageConfig(adv_estimator="gigpo", method="identity"))
    adv, mask = out["advantages"], batch.tensors["response_mask"]
    assert adv[~mask].abs().sum() == 0
    # the successful trajectory's tokens get the larger advantage on the shared first step
    assert float(adv[0, 2]) > float(adv[1, 2])


def test_step_reinforce_gets_discounted_turn_returns_per_turn():
    # a: two turns rewarded 0.5 each; b: two turns rewarded 0. step_reward_gamma 0.5 ->
    # a's turn returns 0.5 + 0.5 * 0.5 = 0.75 and 0.5; token gamma 0.5 within each turn
    trajs = [_traj("a", "g", "A", 1.0, n_turns=2), _traj("b", "g", "A", 0.0, n_turns=2)]
    batch = collate_trajectories(trajs, pad_token_id=0)
    cfg = AdvantageConfig(
        adv_estimator="step_reinforce", method="identity", gigpo_gamma=0.5, gamma=0.5
    )
    adv, mask = compute_advantages(batch, cfg)["advantages"], batch.tensors["response_mask"]
    assert adv[~mask].abs().sum() == 0
    assert adv[0][mask[0]].tolist() == [0.375, 0.75, 0.25, 0.5]
    assert adv[1][mask[1]].tolist() == [0.0, 0.0, 0.0, 0.0]
    # defaults (step_reward_gamma 0.95, mean_std): returns 0.975, 0.5, 0, 0 normalised together
    normed = compute_advantages(batch, AdvantageConfig(adv_estimator="step_reinforce"))
    last = normed["advantages"][:, [3, 6]]  # each turn's last model token (turn = 2 tokens)
    want = torch.tensor(_plain_group_norm([0.975, 0.5, 0.0, 0.0], [0] * 4))
    torch.testing.assert_close(last.reshape(-1), want, atol=1e-4, rtol=0)


def test_method_mean_subtracts_the_group_mean():
    # schema and rl_algos accept method "mean"; the runtime refused it after validation
    trajs = [_traj("a", "g", "A", 3.0), _traj("b", "g", "A", 1.0)]
    batch = collate_trajectories(trajs, pad_token_id=0)
    out = compute_advantages(batch, AdvantageConfig(adv_estimator="reinforce", method="mean"))
    mask = batch.tensors["response_mask"]
    assert out["advantages"][0][mask[0]].tolist() == [1.0, 1.0]
    assert out["advantages"][1][mask[1]].tolist() == [-1.0, -1.0]


def test_unknown_names_are_errors():
    with pytest.raises(ValueError, match="adv_estimator='ppo'"):
        AdvantageConfig(adv_estimator="ppo")
    with pytest.raises(ValueError, match="grouping"):
        AdvantageConfig(grouping="prompt")


def test_dr_grpo_and_rloo_see_raw_rewards_and_refuse_z_scored_ones():
    """Dr.GRPO: A = r - mean_g(r), no std (arXiv:2503.20783); RLOO: r minus the mean of the
    others. Groups [1, 0, 0, 0] and [1, 1, 1, 0], by hand. z-scored rewards before them would make
    dr_grpo equal grpo ([1.5, -0.5, ...]): refused."""
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    trajs = [_traj(f"t{i}", f"g{i // 4}", "A", r) for i, r in enumerate(rewards)]
    batch = collate_trajectories(trajs, pad_token_id=0)
    mask = batch.tensors["response_mask"]

    def first_token(estimator: str) -> list[float]:
        adv = compute_advantages(batch, AdvantageConfig(adv_estimator=estimator, method="identity"))
        return [float(adv["advantages"][i][mask[i]][0]) for i in range(len(rewards))]

    assert first_token("dr_grpo") == pytest.approx(
        [0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75]
    )
    third = 1 / 3
    assert first_token("rloo") == pytest.approx(
        [1, -third, -third, -third, third, third, third, -1]
    )
    with pytest.raises(ValueError, match="reward_normalization.method='mean_std'"):
        AdvantageConfig(adv_estimator="dr_grpo")
