import pytest
import torch

from rl_algos.advantages import list_estimators
from rl_algos.estimate import clip_row_values, estimator_needs, reward_clip_site
from rl_config.records import Trajectory, Turn
from rl_config.schema.algorithm import STD_FREE_ESTIMATORS
from rl_runtime.step.advantages import AdvantageConfig, compute_advantages, step_rows
from rl_runtime.step.collate import collate_trajectories


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


# ------------------------------------------------------------------------------- reward_clip
# ROLL's key: the normalised rewards are clamped to [-reward_clip, reward_clip], as ROLL's
# reward_postprocess (RLVR) and compute_response_level_rewards (agentic) do, before the reinforce
# return.
def _batch(rewards: list[float], group_size: int = 4, n_turns: int = 1):
    trajs = [
        _traj(f"t{i}", f"g{i // group_size}", "A", r, n_turns=n_turns, obs=(7 + i % 2,))
        for i, r in enumerate(rewards)
    ]
    return collate_trajectories(trajs, pad_token_id=0)


def _per_row(adv: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """The value of each row, checking that it is on every model token and 0 elsewhere."""
    out = []
    for b in range(adv.shape[0]):
        tokens = adv[b][mask[b]]
        assert torch.equal(tokens, tokens[:1].expand_as(tokens)), tokens
        assert adv[b][~mask[b]].abs().sum() == 0
        out.append(float(tokens[0]))
    return out


def _roll_grpo(rewards: list[float], group_size: int, clip: float) -> list[float]:
    """ROLL's grpo as a plain loop: reward_norm with group mean and unbiased group std
    (`(r - mean) / (std + 1e-6)`), `torch.clamp(-clip, clip)`, then the reinforce return with
    gamma 1 (the response-level reward on every token)."""
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = sum(group) / len(group)
        std = (sum((r - mean) ** 2 for r in group) / (len(group) - 1)) ** 0.5
        out += [max(-clip, min(clip, (r - mean) / (std + 1e-6))) for r in group]
    return out


def test_grpo_clamps_the_group_normalised_reward_as_roll():
    """Group [0, 0, 0, 10]: mean 2.5, unbiased std sqrt((3 * 2.5**2 + 7.5**2) / 3) = 5, z-scores
    [-0.5, -0.5, -0.5, 1.5]; reward_clip 1 clamps the outlier to 1.0. Group [1, 0, 1, 0]: mean
    0.5, std sqrt(4 * 0.25 / 3) = 0.5774, z = +-0.866: not clamped. 1 of 8 rewards clamped.
    The old RLVR clip (raw rewards, before normalising) gave [0, 0, 0, 1] -> z-scores
    [-0.5, -0.5, -0.5, 1.5]: the outlier kept 1.5."""
    rewards = [0.0, 0.0, 0.0, 10.0, 1.0, 0.0, 1.0, 0.0]
    batch = _batch(rewards)
    mask = batch.tensors["response_mask"]
    out = compute_advantages(batch, AdvantageConfig(adv_estimator="grpo", reward_clip=1.0))
    got = _per_row(out["advantages"], mask)
    z = 0.5 * 3**0.5  # 0.866 = 0.5 / sqrt(1/3)
    assert got == pytest.approx([-0.5, -0.5, -0.5, 1.0, z, -z, z, -z], abs=1e-5)
    assert got[3] == 1.0  # clamped exactly
    assert got == pytest.approx(_roll_grpo(rewards, 4, 1.0), abs=1e-5)
    assert float(out["reward_clip_frac"]) == 1 / 8
    assert torch.equal(out["returns"], out["advantages"])


def test_reinforce_on_raw_rewards_clamps_them_as_rolls_webshop_example():
    """ROLL's agentic_val_webshop_amd: reinforce, reward_normalization identity, reward_clip 20.
    Rewards [0, 50, -30, 5] -> [0, 20, -20, 5] on every model token; 2 of 4 clamped. gae with
    zero values and gamma = lam = 1 gives the same (the reward-to-go of the clamped reward)."""
    batch = _batch([0.0, 50.0, -30.0, 5.0])
    mask = batch.tensors["response_mask"]
    cfg = AdvantageConfig(adv_estimator="reinforce", method="identity", reward_clip=20.0)
    out = compute_advantages(batch, cfg)
    assert _per_row(out["advantages"], mask) == [0.0, 20.0, -20.0, 5.0]
    assert out["scores"].tolist() == [0.0, 20.0, -20.0, 5.0]
    assert float(out["reward_clip_frac"]) == 0.5
    gae = AdvantageConfig(adv_estimator="gae", method="identity", reward_clip=20.0)
    values = torch.zeros(mask.shape)
    assert _per_row(compute_advantages(batch, gae, values=values)["advantages"], mask) == [
        0.0,
        20.0,
        -20.0,
        5.0,
    ]


def test_dr_grpo_takes_the_clamped_rewards():
    """Dr.GRPO (identity normalisation): [0, 0, 0, 10] clamped to 1 -> [0, 0, 0, 1], minus the
    group mean 0.25 -> [-0.25, -0.25, -0.25, 0.75] (unclamped: [-2.5, -2.5, -2.5, 7.5])."""
    batch = _batch([0.0, 0.0, 0.0, 10.0])
    cfg = AdvantageConfig(adv_estimator="dr_grpo", method="identity", reward_clip=1.0)
    got = _per_row(compute_advantages(batch, cfg)["advantages"], batch.tensors["response_mask"])
    assert got == [-0.25, -0.25, -0.25, 0.75]


def test_step_reinforce_clamps_each_steps_normalised_return_before_the_token_discount():
    """a: two turns rewarded 0.5 each, step_reward_gamma 0.5 -> turn returns 0.75 and 0.5
    (identity normalisation); b: 0 and 0. reward_clip 0.6 clamps 0.75 to 0.6, then the token
    discount 0.5 within the turn: [0.3, 0.6]; the second turn stays [0.25, 0.5]. ROLL clamps the
    step's normalised reward, then takes the reinforce return. 1 of 4 step rows clamped."""
    batch = _batch([1.0, 0.0], group_size=2, n_turns=2)
    cfg = AdvantageConfig(
        adv_estimator="step_reinforce",
        method="identity",
        gigpo_gamma=0.5,
        gamma=0.5,
        reward_clip=0.6,
    )
    out = compute_advantages(batch, cfg)
    adv, mask = out["advantages"], batch.tensors["response_mask"]
    assert adv[0][mask[0]].tolist() == pytest.approx([0.3, 0.6, 0.25, 0.5], abs=1e-7)
    assert adv[1][mask[1]].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert float(out["reward_clip_frac"]) == 0.25


def test_clip_row_values_scales_a_clamped_row_and_leaves_the_others_bit_identical():
    """Rows: a constant 3 (clamped to exactly 1), a reward-to-go 4 * [0.5, 1] (value 4 on the
    last token -> 1 * [0.5, 1]), -0.3 (kept bit for bit), and a row without model tokens."""
    adv = torch.tensor([[3.0, 3.0, 0.0], [2.0, 4.0, 0.0], [-0.3, -0.3, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    rows, hit = clip_row_values(adv, mask, 1.0)
    assert rows[0].tolist() == [1.0, 1.0, 0.0]
    assert rows[1].tolist() == [0.5, 1.0, 0.0]
    assert torch.equal(rows[2:], adv[2:])
    assert hit.tolist() == [True, True, False, False]


def _setting(name: str) -> dict:
    """A config and the inputs each registered estimator needs, on 2 groups of 4 rows with two
    turns each (step-wise estimators) and rewards with one outlier."""
    method = "identity" if name in STD_FREE_ESTIMATORS else "mean_std"
    rewards = [0.0, 0.05, 0.0, 10.0, 1.0, 0.0, 0.5, 0.0]
    batch = _batch(rewards, n_turns=2)
    needs = estimator_needs(name)
    mask = batch.tensors["response_mask"]
    kwargs = {}
    if "values" in needs:
        kwargs["values"] = torch.linspace(-1.0, 1.0, mask.numel()).reshape(mask.shape)
    if "baseline_scores" in needs:
        kwargs["baseline_scores"] = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.2, 0.2, 0.2, 0.2])
    if "sum_pi_squared" in needs:  # the actor's statistics (optimal_token_baseline)
        kwargs["log_probs"] = -torch.linspace(0.1, 2.0, mask.numel()).reshape(mask.shape)
        kwargs["sum_pi_squared"] = torch.linspace(0.2, 0.9, mask.numel()).reshape(mask.shape)
    return {"batch": batch, "method": method, "kwargs": kwargs}


@pytest.mark.parametrize("name", list_estimators())
def test_a_clip_that_does_not_bind_changes_nothing_bit_for_bit(name):
    """No silent change of any run's numbers: a clip larger than every normalised reward gives
    the advantages, returns and scores of a run without reward_clip, bit for bit."""
    s = _setting(name)
    unset = compute_advantages(s["batch"], AdvantageConfig(name, method=s["method"]), **s["kwargs"])
    loose = AdvantageConfig(name, method=s["method"], reward_clip=1e6)
    out = compute_advantages(s["batch"], loose, **s["kwargs"])
    for key in ("advantages", "returns", "scores"):
        assert torch.equal(out[key], unset[key]), key
    assert float(out["reward_clip_frac"]) == 0.0 and "reward_clip_frac" not in unset


@pytest.mark.parametrize("name", list_estimators())
def test_a_binding_clip_is_not_undone_by_the_estimator(name):
    """With the clip binding, every estimator's advantages change (grpo's own group z-score of
    clamped scores would give back the unclamped ones for a group like [0, 0, 0, 10]: it is
    clamped after the estimator); where the clamp acts on the estimator's per-row value, no
    advantage exceeds it."""
    s = _setting(name)
    plain = compute_advantages(s["batch"], AdvantageConfig(name, method=s["method"]), **s["kwargs"])
    cfg = AdvantageConfig(name, method=s["method"], reward_clip=0.6)
    out = compute_advantages(s["batch"], cfg, **s["kwargs"])
    assert not torch.equal(out["advantages"], plain["advantages"])
    assert 0.0 < float(out["reward_clip_frac"]) < 1.0
    if reward_clip_site(name) == "advantages":
        assert float(out["advantages"].abs().max()) <= float(torch.tensor(0.6))
    else:
        assert float(out["scores"].abs().max()) <= float(torch.tensor(0.6))


def test_reward_clip_must_be_positive():
    with pytest.raises(ValueError, match="reward_clip=0.0 must be > 0"):
        AdvantageConfig(reward_clip=0.0)
