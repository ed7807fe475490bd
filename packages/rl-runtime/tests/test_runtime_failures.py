"""Failed episodes are not trained on: they add no loss and no gradient, are counted in metrics,
and too many of them stop training with an error naming `max_failed_fraction`."""

import pytest
import torch

from rl_algos.aggregate import aggregate
from rl_algos.losses import ppo_clip
from rl_config.records import Trajectory, Turn
from rl_runtime.step.collate import collate_trajectories
from rl_runtime.step.failures import (
    SandboxCounters,
    TooManyFailuresError,
    merge_counts,
    screen_failures,
)


def _traj(name, n_prompt=2, n_model=3, *, failed=False, info=None, timeout=False):
    """prompt tokens, then `n_model` model tokens (one turn)."""
    n = n_prompt + n_model
    return Trajectory(
        traj_id=name,
        group_id="g0",
        tag="t",
        env_seed=0,
        token_ids=list(range(1, n + 1)),
        prompt_length=n_prompt,
        response_mask=[False] * n_prompt + [True] * n_model,
        rollout_log_probs=[0.0] * n_prompt + [-1.0] * n_model,
        turns=[Turn(turn_idx=0, start=n_prompt, end=n, reward=1.0, info=dict(info or {}))],
        episode_reward=1.0,
        termination_reason="error" if failed else "terminated",
        failed=failed,
        error="env step: RuntimeError: boom" if failed else None,
        metrics={"env_timeout": float(timeout)},
    )


@pytest.mark.parametrize(
    ("mode", "expected_loss", "grad_a", "grad_c"),
    [
        ("token-mean", -1.0, -1 / 5, -1 / 5),  # 5 good tokens
        ("seq-mean-token-mean", -1.0, -1 / 6, -1 / 4),  # 2 good rows of 3 and 2 tokens
        ("seq-mean-token-sum", -2.5, -1 / 2, -1 / 2),  # (-3 + -2) / 2 good rows
    ],
)
def test_failed_rows_contribute_zero_loss_and_zero_gradient(mode, expected_loss, grad_a, grad_c):
    """Rows: good a (3 model tokens), failed b (3), good c (2). Advantages: 1 on good rows, 100 on
    the failed one (what a failed episode must not push). At ratio 1 PPO's per-token loss is -A;
    the values pinned are those of the good rows alone."""
    batch = collate_trajectories(
        [_traj("a"), _traj("b", failed=True), _traj("c", n_model=2)], pad_token_id=0
    )
    mask = batch.tensors["response_mask"]
    assert mask[1].sum() == 0 and mask[0].sum() == 3 and mask[2].sum() == 2
    old = batch.tensors["rollout_log_probs"]
    log_probs = old.clone().requires_grad_(True)
    advantages = torch.ones_like(old)
    advantages[1] = 100.0
    out = ppo_clip(log_probs, old, advantages, mask)
    loss = aggregate(out.loss_mat, out.mask, mode)
    loss.backward()
    grad = log_probs.grad
    assert grad is not None
    assert loss.item() == pytest.approx(expected_loss, abs=1e-6)
    assert torch.equal(grad[1], torch.zeros_like(grad[1]))  # the failed row: exactly nothing
    assert torch.allclose(grad[0, 2:5], torch.full((3,), grad_a))
    assert torch.allclose(grad[2, 2:4], torch.full((2,), grad_c))


def test_screen_drops_and_counts_failures_by_kind():
    batch = [
        _traj("ok1"),
        _traj("err", failed=True),
        _traj("ok2"),
        _traj("grader", info={"reward_failed": True, "reward_error": "timeout"}),
        _traj("slow", failed=True, timeout=True),
    ]
    screened = screen_failures(batch, max_failed_fraction=0.6)
    assert [t.traj_id for t in screened.kept] == ["ok1", "ok2"]
    assert screened.metrics == {
        "failures/episodes": 3.0,
        "failures/fraction": 0.6,
        "failures/errors": 1.0,
        "failures/env_timeouts": 1.0,
        "failures/reward_failures": 1.0,
    }
    clean = screen_failures(batch[:1], max_failed_fraction=0.0)
    assert clean.metrics["failures/episodes"] == 0.0 and len(clean.kept) == 1


def test_too_many_failures_stop_training_naming_the_key():
    batch = [_traj("ok"), _traj("err", failed=True), _traj("err2", failed=True)]
    with pytest.raises(TooManyFailuresError, match=r"2 of 3 .*max_failed_fraction=0.5") as info:
        screen_failures(batch, max_failed_fraction=0.5)
    assert "boom" in str(info.value)  # an example reason is shown
    with pytest.raises(TooManyFailuresError, match="none left to train on"):
        screen_failures(batch[1:], max_failed_fraction=1.0)
    with pytest.raises(ValueError, match="max_failed_fraction must be in"):
        screen_failures(batch, max_failed_fraction=1.5)


def test_max_failed_fraction_is_a_described_config_key():
    from rl_config import ExperimentConfig

    field = ExperimentConfig.model_fields["max_failed_fraction"]
    assert field.default == 0.5 and "failures/*" in (field.description or "")


class _ToolEnv:
    def __init__(self, pool):
        self.pool = pool


def test_sandbox_timeouts_become_metrics():
    """A real sandbox pool: a call that runs past its timeout is killed; the per-rollout deltas
    of the pool's stats (every key it has: calls, failures, kind.*, worker_restarts ...) come out
    as sandbox/* metrics."""
    from rl_envs.sandbox.pool import SandboxPool

    counters = SandboxCounters()
    with SandboxPool(1) as pool:
        assert pool.run_python("print(1)").ok  # before the rollout: not counted
        env = _ToolEnv(pool)
        snapshot = counters.start([env, env])  # one pool, reached twice
        result = pool.run_python("while True: pass", timeout_s=0.5)
        assert result.kind == "timeout"
        assert pool.run_python("print(2)").ok
        counters.stop(snapshot, "train")
    metrics = counters.take("train")
    assert metrics["sandbox/kind.timeout"] == 1.0 and metrics["sandbox/failures"] == 1.0
    assert metrics["sandbox/calls"] == 2.0 and metrics["sandbox/kind.ok"] == 1.0
    assert counters.take("train") == {}
    assert merge_counts([metrics, {"sandbox/calls": 3.0}])["sandbox/calls"] == 5.0


def test_an_evaluations_sandbox_counts_are_its_own_while_training_grades_at_once():
    """Evaluation and training rollout running at once on one worker (a Ray actor with
    max_concurrency 2 under asynchronous training), their envs grading in the same sandbox
    pool: each split's `sandbox/*` counts exactly its own envs' calls. Before, both splits took
    deltas of the shared pool's totals, so each counted the other's gradings as well (5 and 5
    here, for 3 and 2)."""
    from rl_envs.rewards import make_reward_pool
    from rl_envs.tasks import CountdownEnv

    counters = SandboxCounters()
    with make_reward_pool(1, allow_weak_isolation=True) as pool:
        val_envs = [CountdownEnv(pool=pool) for _ in range(3)]
        train_envs = [CountdownEnv(pool=pool) for _ in range(2)]
        for i, env in enumerate(val_envs + train_envs):
            env.reset(seed=i)
        val = counters.start(val_envs)  # evaluation starts while training rollout runs ...
        train = counters.start(train_envs)
        for env in (val_envs[0], train_envs[0], val_envs[1], train_envs[1], val_envs[2]):
            env.step("<answer>1 + 2</answer>")  # ... and their gradings interleave
        counters.stop(train, "train")
        counters.stop(val, "val")
        assert pool.stats()["calls"] == 5
    val_counts, train_counts = counters.take("val"), counters.take("train")
    assert val_counts["sandbox/calls"] == 3.0 and train_counts["sandbox/calls"] == 2.0
    assert val_counts["sandbox/kind.ok"] == 3.0 and train_counts["sandbox/failures"] == 0.0


def test_failure_and_sandbox_metrics_are_trackable(tmp_path):
    from rl_runtime.track.tracking import Tracker

    screened = screen_failures([_traj("ok"), _traj("err", failed=True)], 0.5)
    tracker = Tracker("stdout", str(tmp_path), {})
    try:
        tracker.log({**screened.metrics, "sandbox/kind.timeout": 1.0}, step=1)
    finally:
        tracker.close()
    assert tracker.history[-1]["failures/episodes"] == 1.0


def test_evaluation_sandbox_calls_are_not_counted_as_the_next_training_steps(tmp_path):
    """A real rollout worker (in-process, a tiny model, countdown graded in the real sandbox):
    an evaluation's sandbox calls are kept apart from training's, so a training step's
    `sandbox/*` are its own rollout's. Before, every rollout call added to one total that the
    next training rollout took: with evaluation every step, `sandbox/calls` doubled."""
    from types import SimpleNamespace

    from rl_config.records import SamplingParams
    from rl_rollout.tiny_model import build_tiny_model
    from rl_runtime.cluster.placement import plan_placement
    from rl_runtime.cluster.worker_group import WorkerGroup
    from rl_runtime.cluster.workers import RolloutWorker
    from rl_runtime.pipelines.agentic.rollout import play, sandbox_stats

    model = str(build_tiny_model(tmp_path / "tiny", seed=0))
    infer = WorkerGroup.create(
        "actor_infer",
        RolloutWorker,
        plan_placement({"actor_infer": [0]}, num_devices=1).roles["actor_infer"],
        mode="local",
        rpc_timeout=120,
        init_kwargs={
            "model_path": model,
            "strategy_name": "hf_infer",
            "env_configs": {"X": {"env_type": "countdown", "config": {}}},
            "agent_kwargs": {"max_tokens_per_step": 4, "max_sequence_length": 256},
        },
    )
    ctx = SimpleNamespace(
        cluster={"actor_infer": infer}, components=SimpleNamespace(render_dir=None), step=0
    )
    sampling = SamplingParams(max_new_tokens=4, seed=0)
    try:
        play(ctx, [(f"v{i}", "X", 100 + i) for i in range(3)], sampling, "val")
        play(ctx, [(f"t{i}", "X", i) for i in range(2)], sampling, "train")
        assert sandbox_stats(ctx, "train")["sandbox/calls"] == 2.0  # one grading per episode
        assert sandbox_stats(ctx, "val")["sandbox/calls"] == 3.0
        assert sandbox_stats(ctx, "train") == {}  # taken
    finally:
        infer.shutdown()
