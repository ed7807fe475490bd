"""Kill test: SIGKILL the agentic app's trainer (on Ray, the default) mid-step, mid-save and right
after a save; each time resume; the final state equals an uninterrupted run's: parameters,
optimizer moments, every rank's torch/python/numpy RNG, the driver's RNG and env seed epoch.

The kills are real (the process sends itself SIGKILL at a fault point named by
``$RL_FAULT_INJECT``, rl_train.faults), so nothing is flushed, closed or cleaned up:
- ``train.after_optimizer_step@2``: the TrainWorker actor dies after step 2's optimizer update
  (parameters changed, nothing saved);
- ``checkpoint.before_marker@2``: the TrainWorker dies while saving step 2, every file written
  and signed but no marker (the driver removes that partial checkpoint);
- ``run_checkpoint.after_commit@2``: the driver dies right after step 2's checkpoint is committed,
  before the older one is pruned.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "agentic"
CONFIG = APP / "configs" / "cpu_default.yaml"
MAX_STEPS = 3


def _overrides(out: Path, model: Path) -> list[str]:
    base = {
        "output_dir": out,
        "logging_dir": out / "logs",
        "render_save_dir": out / "render",
        "checkpoint_config.output_dir": out / "ckpt",
        "pretrain": model,
        "track_with": "stdout",
        "max_steps": MAX_STEPS,
        "save_steps": 1,
        "max_ckpt_to_keep": 1,
        "eval_steps": 1000,
        "resume_from_checkpoint": "true",
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
        "agentic_app.num_cpus": 2,
    }
    return [f"{k}={v}" for k, v in base.items()]


def _launch(out: Path, model: Path, key: Path, fault: str | None = None) -> int:
    """Run the app to completion or to its kill; returns the exit code. Whatever the run left
    behind in its session (a killed driver's Ray processes) is killed too."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RL_CHECKPOINT_KEY_FILE": str(key), "OMP_NUM_THREADS": "1"}
    env.pop("RL_FAULT_INJECT", None)
    if fault:
        env["RL_FAULT_INJECT"] = fault
    cmd = [sys.executable, str(APP), "--config", str(CONFIG), *_overrides(out, model)]
    with open(out / f"launch_{len(list(out.glob('launch_*')))}.log", "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=600)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    return rc


def _dcp_state(path: Path) -> dict:
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    return _load_state_dict_from_keys(checkpoint_id=str(path))


def _flat(tree: dict, prefix: str = "") -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for k, v in tree.items():
        name = f"{prefix}{k}"
        out += _flat(v, name + ".") if isinstance(v, dict) else [(name, v)]
    return out


def _assert_equal(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _final_state(run: Path, key: Path) -> dict:
    """Everything the final checkpoint holds, read after verifying its signature."""
    from rl_runtime.state.checkpoint import RunCheckpoints
    from rl_train.checkpoint import verify

    mgr = RunCheckpoints(run / "ckpt", keep_last=None, key_file=key)
    final = mgr.latest()
    assert final is not None and final.name == f"step-{MAX_STEPS:06d}", mgr.skipped
    role = final / "actor_train" / f"step-{MAX_STEPS:06d}"
    verify(role, key_file=key)
    state = mgr.load_state(final)
    return {
        "model_optim": _dcp_state(role / "model_optim"),
        "trainer_rng": torch.load(role / "rng_rank0.pt", weights_only=True),
        "trainer_state": json.loads((role / "trainer_state.json").read_text()),
        "driver_rng": state.rng,
        "run": (state.step, state.weight_version, state.env_seed_epoch),
    }


def assert_same_final_state(full: Path, killed: Path, key: Path) -> None:
    expected, got = _final_state(full, key), _final_state(killed, key)
    _assert_equal(expected, got, "final")
    # the run trained: Adam moments are not zero
    moments = [v for k, v in _flat(got["model_optim"]) if k.endswith(".exp_avg_sq")]
    assert moments
    assert all(bool(m.abs().sum() > 0) for m in moments)
    # same env seeds and samples after every resume: the logged steps agree
    m_full, m_killed = _metrics(full), _metrics(killed)
    # each step logged once: every resume cut metrics.jsonl back to its checkpoint
    assert _trained_steps(killed) == _trained_steps(full) == list(range(1, MAX_STEPS + 1))
    for step in range(1, MAX_STEPS + 1):
        for k in ("env/episode_reward", "rollout/response_tokens", "train/loss", "train/grad_norm"):
            assert m_killed[step][k] == m_full[step][k], (step, k)


def _metrics(run: Path) -> dict[int, dict]:
    rows = [json.loads(x) for x in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "train/loss" in r}


def _trained_steps(run: Path) -> list[int]:
    rows = [json.loads(x) for x in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "train/loss" in r]


def _committed(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "ckpt").glob("step-*") if (p / "COMMITTED").exists())


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
@pytest.mark.timeout(1500)  # five app launches on Ray; about 10 min on a loaded 2-core box
def test_sigkill_mid_step_mid_save_after_save_resumes_bit_exact(tmp_path):
    from rl_rollout.tiny_model import build_tiny_model

    model = Path(build_tiny_model(tmp_path / "tiny_model"))
    key = tmp_path / "key" / "checkpoint.key"
    full, killed = tmp_path / "full", tmp_path / "killed"
    assert _launch(full, model, key) == 0

    # 1. the trainer dies mid-step 2: step 1 is the newest checkpoint
    assert _launch(killed, model, key, "train.after_optimizer_step@2") != 0
    assert _committed(killed) == ["step-000001"]
    # 2. resumed, the trainer dies saving step 2 (files written and signed, no marker): the driver
    # sees the save fail and removes the partial directory; step 1 survives
    assert _launch(killed, model, key, "checkpoint.before_marker@2") != 0
    assert _committed(killed) == ["step-000001"]
    assert not list((killed / "ckpt").glob(".tmp-step-000002-*"))
    # 3. resumed, the driver dies right after committing step 2, before pruning step 1
    rc = _launch(killed, model, key, "run_checkpoint.after_commit@2")
    assert rc == -signal.SIGKILL
    assert _committed(killed) == ["step-000001", "step-000002"]
    # 4. resumed from step 2, runs to the end
    assert _launch(killed, model, key) == 0
    assert _committed(killed) == [f"step-{MAX_STEPS:06d}"]

    assert_same_final_state(full, killed, key)
