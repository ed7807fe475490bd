"""Every advantage estimator of rl_algos' registry, by name, runs the agentic app end to end on
the CPU (in-process workers, tiny model, two steps): gae with a critic, remax with greedy baseline
rollouts, gigpo on per-turn steps, the group estimators on env groups."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rl_algos.advantages import list_estimators
from rl_config.schema.algorithm import STD_FREE_ESTIMATORS
from tests.app_loading import app_main

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "agentic"


def _overrides(out: Path, tiny: Path, estimator: str) -> list[str]:
    base = {
        "output_dir": out,
        "logging_dir": out / "logs",
        "render_save_dir": out / "render",
        "checkpoint_config.output_dir": out / "ckpt",
        "pretrain": tiny,
        "agentic_app.build_tiny_model": tiny,
        "track_with": "stdout",
        "max_steps": 2,
        "eval_steps": 0,
        "save_steps": 1000,
        "rollout_batch_size": 8,
        "train_env_manager.num_env_groups": 2,
        "train_env_manager.group_size": 4,
        "train_env_manager.num_groups_partition": "[2]",
        "val_env_manager.num_env_groups": 2,
        "val_env_manager.num_groups_partition": "[2]",
        "actor_train.training_args.per_device_train_batch_size": 8,
        "actor_train.training_args.gradient_accumulation_steps": 1,
        "custom_envs.FrozenLake.max_steps": 3,
        "custom_envs.FrozenLake.env_config.max_steps": 3,
        "adv_estimator": estimator,
        "agentic_app.warmup.steps": 0,
        "agentic_app.eval_before_training": "false",
        "agentic_app.eval_greedy": "false",
        "agentic_app.export_hf": "false",
    }
    if estimator in STD_FREE_ESTIMATORS:  # their own baseline, raw rewards (rl_config.rules)
        base["reward_normalization.method"] = "identity"
    if estimator == "gae":
        base["+critic"] = (
            "{training_args: {per_device_train_batch_size: 8}, device_mapping: [0], "
            "strategy_args: {strategy_name: fsdp2_train, strategy_config: {}}}"
        )
    return [f"{k}={v}" for k, v in base.items()]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    """Where the app builds the tiny model on the first run; later runs reuse it."""
    return tmp_path_factory.mktemp("estimators") / "tiny_model"


@pytest.mark.slow
@pytest.mark.parametrize("name", list_estimators())
def test_estimator_runs_two_steps(name, tmp_path, tiny_model_dir):
    out = tmp_path / name
    assert app_main("agentic")(["--no-ray", *_overrides(out, tiny_model_dir, name)]) == 0
    rows = [json.loads(x) for x in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(math.isfinite(r["train/loss"]) for r in steps)
    if name == "gae":
        assert all(math.isfinite(r["critic/vf_loss"]) for r in steps)


@pytest.mark.slow
def test_reward_clip_runs_through_the_agentic_app_and_is_logged(tmp_path, tiny_model_dir):
    """ROLL's reward_clip in the agentic pipeline (refused before): two steps of reinforce on
    raw rewards (identity normalisation) clamped to [-0.05, 0.05]. The untrained tiny model's
    invalid moves cost format_penalty -0.1 each, so episodes below -0.05 are clamped: the
    fraction clamped is logged and positive, and every advantage (the clamped reward on each
    model token) is within the clip."""
    out = tmp_path / "clip"
    overrides = [
        *_overrides(out, tiny_model_dir, "reinforce"),
        "reward_normalization.method=identity",
        "reward_clip=0.05",
    ]
    assert app_main("agentic")(["--no-ray", *overrides]) == 0
    rows = [json.loads(x) for x in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(math.isfinite(r["train/loss"]) for r in steps)
    assert all(r["env/episode_reward"] < -0.05 for r in steps)  # some episode is clamped
    assert all(0.0 < r["train/reward_clip_frac"] <= 1.0 for r in steps)
    assert all(abs(r["train/advantage_mean"]) <= 0.05 + 1e-7 for r in steps)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_ppo_with_a_critic_learns_from_a_reward_model_scoring_episodes_at_their_end(
    mode, tmp_path, tiny_model_dir
):
    """PPO (gae, a critic) in the agentic app with a reward model on its own role (sharing
    device 0 with the trainers: it sleeps between scorings) adding its score at each episode's
    end: every training and validation episode is scored, none fails, critic and actor train two
    steps; asynchronously (actor_infer on device 1) the producer thread scores the rollouts."""
    from rl_rollout.tiny_reward_models import build_tiny_reward_model

    out = tmp_path / "rm"
    rm = build_tiny_reward_model(tmp_path / "tiny_rm")
    overrides = [*_overrides(out, tiny_model_dir, "gae"), "eval_steps=2",
                 "rewards.rm.reward_fn=reward_model", f"rewards.rm.model_args.model_name_or_path={rm}",
                 "rewards.rm.device_mapping=[0]", "rewards.rm.infer_batch_size=4"]  # fmt: skip
    if mode == "async":
        overrides += [
            "num_gpus_per_node=2",
            "actor_infer.device_mapping=[1]",
            "async.max_staleness=1",
        ]
    assert app_main("agentic")(["--no-ray", *overrides]) == 0
    rows = [json.loads(x) for x in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["reward/model/rm/scored"] == 8 and r["reward/model/rm/failed"] == 0
        assert math.isfinite(r["reward/model/rm/mean"]) and r["failures/reward_failures"] == 0
        assert math.isfinite(r["critic/vf_loss"]) and math.isfinite(r["train/loss"])
    if mode == "async":
        assert all(r["async/lag_max"] <= 1 for r in steps)
    (val,) = [r for r in rows if "val/reward/model/rm/scored" in r]
    assert val["val/reward/model/rm/scored"] == val["val/num_episodes"] > 0
