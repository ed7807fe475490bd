import msgspec

from rl_config.records import Trajectory
from rl_runtime.step.collate import collate_trajectories
from rl_runtime.step.metrics import rollout_metrics, val_metrics


def _traj(tid, response_versions, prompt_version=None):
    """A 2-token prompt and a response whose tokens were sampled under `response_versions`
    (empty list: no per-token versions, every token at weight_version 0)."""
    n = len(response_versions) or 3
    first = response_versions[0] if response_versions else 0
    versions = [prompt_version if prompt_version is not None else first] * 2 + response_versions
    return Trajectory(
        traj_id=tid, group_id="g", tag="t", env_seed=0, token_ids=[1, 2] + [5] * n,
        prompt_length=2, response_mask=[False] * 2 + [True] * n,
        rollout_log_probs=[0.0] * (2 + n), weight_version=first,
        token_versions=versions if response_versions else [],
    )  # fmt: skip


def test_resumed_samples_count_generations_spanning_weight_versions():
    trajs = [
        _traj("plain", []),  # no per-token versions
        _traj("one_version", [4, 4, 4]),
        _traj("resumed", [4, 4, 5]),  # partial rollout swapped weights after two tokens
        _traj("prompt_only_differs", [5, 5], prompt_version=4),  # the prompt is not sampled
        _traj("twice", [3, 4, 5]),
    ]
    metrics = rollout_metrics(trajs, collate_trajectories(trajs, pad_token_id=0))
    assert metrics["rollout/resumed_samples"] == 2.0


def test_episodes_the_token_budget_ended_are_counted():
    """An agentic episode whose next turn no longer fits sequence_length ends with
    termination_reason max_length: with a budget too small for the game every episode ended
    after one turn at 0 success, and no metric said why (rollout/truncated counts collation
    cuts only)."""
    cut = [
        msgspec.structs.replace(_traj(str(i), []), termination_reason="max_length") for i in "ab"
    ]
    trajs = [
        *cut,
        _traj("c", []),
        msgspec.structs.replace(_traj("d", []), termination_reason="success"),
    ]
    metrics = rollout_metrics(trajs, collate_trajectories(trajs, pad_token_id=0, max_length=64))
    assert metrics["env/length_truncated"] == 0.5 and metrics["rollout/truncated"] == 0.0
    assert val_metrics(cut)["val/length_truncated"] == 1.0


def test_rollout_truncated_counts_collation_cuts_only_where_collation_can_cut():
    """`rollout/truncated` means sequences the collation cut at its max_length (agentic's
    sequence_length). RLVR collates without one: it logged 0 every step whatever its responses'
    truncation (`response/truncated_rate`, `env/length_truncated`); now it is absent there."""
    trajs = [_traj("a", []), _traj("b", [1, 1, 1, 1, 1, 1])]  # 5 and 8 tokens
    cut = rollout_metrics(trajs, collate_trajectories(trajs, pad_token_id=0, max_length=6))
    assert cut["rollout/truncated"] == 1.0
    uncut = rollout_metrics(trajs, collate_trajectories(trajs, pad_token_id=0))
    assert "rollout/truncated" not in uncut


def test_an_episode_whose_grader_failed_counts_as_failed():
    """A validation episode whose reward could not be computed (the grader timed out:
    `info["reward_failed"]`) is failed, as training's screening counts it. Before, `val/failed`
    counted only episodes the env or engine failed: with every grading timed out, validation
    reported success 0 and failed 0, a broken grader looking like a bad policy."""
    from rl_config.records import Turn

    ok = _traj("ok", [])
    turn = Turn(turn_idx=0, start=2, end=5, reward=0.0, info={"reward_failed": True})
    graded_badly = msgspec.structs.replace(_traj("timeout", []), turns=[turn])
    env_failed = msgspec.structs.replace(_traj("raised", []), failed=True)
    metrics = val_metrics([ok, graded_badly, env_failed, _traj("ok2", [])])
    assert metrics["val/failed"] == 0.5
