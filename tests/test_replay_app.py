"""Record and replay through real app runs (in-process workers). The agentic app trains 3 steps
with `record_steps=nonfinite` while the test fault `step.nan_advantage@2` gives step 2 a NaN
advantage; only step 2 is recorded, `rl-replay` reproduces it bit-exactly, and
`--detect-anomaly` names the batch tensor the NaN came in with. The RLVR (GRPO) and DPO apps
record step 2 with `record_steps=every:2`: the replay equals the logged step bit-exactly (loss,
grad norm, every metric, the weight checksum)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "agentic"


def _overrides(out: Path, model: Path) -> list[str]:
    base = {
        "output_dir": out,
        "logging_dir": out / "logs",
        "render_save_dir": out / "render",
        "checkpoint_config.output_dir": out / "ckpt",
        "pretrain": model,
        "track_with": "stdout",
        "max_steps": 3,
        "save_steps": 1000,
        "eval_steps": 1000,
        "record_steps": "nonfinite",
        # the untrained tiny model fails every episode: identity scores keep gradients non-zero
        "adv_estimator": "reinforce",
        "reward_normalization.method": "identity",
        "rollout_batch_size": 4,
        "train_env_manager.num_env_groups": 1,
        "train_env_manager.group_size": 4,
        "train_env_manager.num_groups_partition": "[1]",
        "val_env_manager": "null",
        "actor_train.training_args.per_device_train_batch_size": 2,
        "actor_train.training_args.gradient_accumulation_steps": 2,
        "agentic_app.warmup.steps": 0,
        "agentic_app.eval_before_training": "false",
        "agentic_app.export_hf": "false",
    }
    return [f"{k}={v}" for k, v in base.items()]


@pytest.mark.slow
def test_a_nan_step_of_an_app_run_is_recorded_and_replayed_bit_exactly(tmp_path):
    from rl_rollout.tiny_model import build_tiny_model

    model = Path(build_tiny_model(tmp_path / "tiny_model"))
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RL_FAULT_INJECT": "step.nan_advantage@2"}
    cmd = [sys.executable, str(APP), "--no-ray", "--config",
           str(APP / "configs" / "cpu_default.yaml"), *_overrides(out, model)]  # fmt: skip
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    records = out / "records"
    assert sorted(p.name for p in records.iterdir() if not p.name.startswith(".")) == ["step-2"]
    rows = [json.loads(x) for x in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    sizes = [r["record/bytes"] for r in rows if "record/bytes" in r]  # reported once written
    assert len(sizes) == 1 and sizes[0] > 0
    env.pop("RL_FAULT_INJECT")
    replay = [sys.executable, "-m", "rl_runtime.cli.replay", str(records / "step-2")]
    plain = subprocess.run(replay, env=env, capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "bit-exact: yes" in plain.stdout
    found = subprocess.run([*replay, "--detect-anomaly"], env=env, capture_output=True,
                           text=True, timeout=600)  # fmt: skip
    assert found.returncode == 0, found.stdout + found.stderr
    assert "anomaly batch: advantages (1 non-finite" in found.stdout
    assert "anomaly backward:" in found.stdout


class _OneRank:
    def __init__(self, worker) -> None:
        self.worker = worker

    def call_all(self, method: str, *args, **kwargs) -> list:
        return [getattr(self.worker, method)(*args, **kwargs)]


@pytest.mark.slow
@pytest.mark.xdist_group("dist")
def test_a_deepspeed_step_replays_bit_exactly(tmp_path):
    """DeepSpeed (its default ZeRO stage), one rank in this process: the recorded step replays
    to the same loss, grad norm, metrics and weights."""
    import torch

    from rl_rollout.tiny_model import build_tiny_model
    from rl_runtime.cluster.train_worker import TrainWorker
    from rl_runtime.state.recorder import StepRecorder
    from rl_train.args import TrainingArgs
    from rl_train.losses import ActorLossConfig
    from rl_train.testing import make_batch

    model = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_heads=1, intermediate_size=64)
    worker = TrainWorker(
        rank=0, world_size=1, dist_env={}, role="actor", model_path=str(model),
        strategy_name="deepspeed_train",
        training_args=TrainingArgs(per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                   learning_rate=1e-2),
        loss_config=ActorLossConfig(),
    )  # fmt: skip
    recorder = StepRecorder("every", 2, tmp_path / "records", config_hash="c", key_file=None)
    for step in (1, 2):
        batch = make_batch(8, 12, seed=step)
        batch["old_log_probs"] = -4.0 - torch.rand(
            8, 12, generator=torch.Generator().manual_seed(step)
        )
        recorder.train(_OneRank(worker), "actor_train", [batch], "default", step=step,
                       weight_version=step, run=lambda b=batch: [worker.train_step(dict(b))])  # fmt: skip
    worker.shutdown()
    recorder.close()
    # a fresh process, as the command runs (DeepSpeed keeps its first process group's handles)
    cmd = [sys.executable, "-m", "rl_runtime.cli.replay", str(tmp_path / "records" / "step-2")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "bit-exact: yes" in out.stdout


def _replayed_as_logged(out: Path, env: dict[str, str]) -> None:
    """The record of step 2 under `out` replays bit-exactly (loss, grad norm, every metric, the
    weights after the step), and its loss and grad norm are the ones the run logged."""
    from rl_runtime.cli.replay import replay

    records = out / "records"
    assert sorted(p.name for p in records.iterdir() if not p.name.startswith(".")) == ["step-2"]
    result = replay(records / "step-2")
    assert result.bit_exact, result.differences()
    rows = [json.loads(x) for x in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    logged = next(r for r in rows if r["step"] == 2 and "train/loss" in r)
    assert sum(r.get("record/bytes", 0) for r in rows) > 0
    recorded = result.record.metric_values()
    for name in ("loss", "grad_norm"):
        (key,) = [k for k in recorded if k.endswith("/" + name)]
        assert recorded[key].hex() == float(logged["train/" + name]).hex(), name
    cmd = [sys.executable, "-m", "rl_runtime.cli.replay", str(records / "step-2")]
    plain = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "bit-exact: yes" in plain.stdout


def _rlvr(tmp_path: Path, out: Path, **extra: object) -> subprocess.CompletedProcess:
    app = ROOT / "apps" / "rlvr"
    base = {
        "output_dir": out, "logging_dir": out / "logs", "checkpoint_config.output_dir": out / "ckpt",
        "pretrain": tmp_path / "tiny_model", "rlvr_app.build_tiny_model": tmp_path / "tiny_model",
        "track_with": "stdout", "max_steps": 2, "eval_steps": 1000, "save_steps": 1000,
        "record_steps": "every:2", "rollout_batch_size": 4, "num_return_sequences_in_group": 4,
        "actor_train.training_args.per_device_train_batch_size": 8,
        "actor_train.training_args.gradient_accumulation_steps": 2,
        "rlvr_app.warmup.steps": 0, "dynamic_sampling.enable": "false", **extra,
    }  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(app), "--no-ray", "--config", str(app / "configs" / "cpu_default.yaml"),
           *(f"{k}={v}" for k, v in base.items())]  # fmt: skip
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


@pytest.mark.slow
def test_an_rlvr_step_is_recorded_and_replayed_bit_exactly(tmp_path):
    """Also rollout replay: the run records its generations (`record_generations`); a second
    run whose actor_infer is the `replay` engine (no model generates) serves them back and
    trains on the same batches: its record of step 2 equals the first run's bit for bit (the
    batch tensors, every metric, the weights after), and so do its logged losses."""
    out = tmp_path / "run"
    generations = tmp_path / "generations"
    _rlvr(
        tmp_path,
        out,
        **{"actor_infer.strategy_args.strategy_config.record_generations": generations},
    )
    _replayed_as_logged(out, {**os.environ, "OMP_NUM_THREADS": "1"})
    assert sorted(generations.iterdir())  # one file per generate call

    mocked = tmp_path / "mocked"
    _rlvr(tmp_path, mocked, **{"actor_infer.strategy_args.strategy_name": "replay",
                                "actor_infer.strategy_args.strategy_config.generations": generations})  # fmt: skip
    from rl_runtime.state.step_record import read_record

    first, first_tensors = read_record(out / "records" / "step-2" / "actor_train")
    again, again_tensors = read_record(mocked / "records" / "step-2" / "actor_train")
    assert sorted(first_tensors[0]) == sorted(again_tensors[0])
    for key, tensor in first_tensors[0].items():
        assert torch.equal(tensor, again_tensors[0][key]), key
    from rl_runtime.cli.replay import UNCOMPARED_SUFFIXES  # wall-clock throughput

    def numbers(record):
        return {k: v for k, v in record.metrics.items() if not k.endswith(UNCOMPARED_SUFFIXES)}

    assert numbers(again) == numbers(first) and len(numbers(first)) > 10
    assert again.weight_checksum == first.weight_checksum
    losses = [
        [
            json.loads(x).get("train/loss")
            for x in (o / "logs" / "metrics.jsonl").read_text().splitlines()
        ]
        for o in (out, mocked)
    ]
    assert losses[0] == losses[1] and any(v is not None for v in losses[0])


@pytest.mark.slow
def test_a_dpo_step_is_recorded_and_replayed_bit_exactly(tmp_path):
    app = ROOT / "apps" / "dpo"
    out = tmp_path / "run"
    base = {
        "output_dir": out, "logging_dir": out / "logs", "checkpoint_config.output_dir": out / "ckpt",
        "pretrain": tmp_path / "tiny_model", "dpo_app.build_tiny_model": tmp_path / "tiny_model",
        "actor_train.data_args.file_name": tmp_path / "data" / "train.jsonl",
        "actor_train.data_args.eval_file_name": tmp_path / "data" / "heldout.jsonl",
        "track_with": "stdout", "max_steps": 2, "eval_steps": 1000, "save_steps": 1000,
        "record_steps": "every:2",
        "actor_train.training_args.per_device_train_batch_size": 2,
        "actor_train.training_args.gradient_accumulation_steps": 2,
        "dpo_app.arithmetic.train_rows": 24, "dpo_app.arithmetic.eval_rows": 8,
        "dpo_app.greedy_eval_prompts": 4, "dpo_app.eval_before_training": "false",
        "dpo_app.use_ray": "false",
    }  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(app), "--config", str(app / "configs" / "cpu_default.yaml"),
           *(f"{k}={v}" for k, v in base.items())]  # fmt: skip
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    _replayed_as_logged(out, env)
