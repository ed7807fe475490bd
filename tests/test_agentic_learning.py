"""apps/agentic's claims on short runs of the CPU default: the same seed gives the same
validation numbers, and RL improves held-out success over the warm-up.

Both run the app as a user does (a subprocess, stdout to a pipe), scaled down by overrides; the
determinism test with Ray, the learning test in-process (`--no-ray`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "agentic"


def _run(out: Path, *flags: str, **overrides: object) -> dict:
    """One run of the default under `out` (`flags` e.g. `--no-ray`); its summary.json."""
    keys = {
        "output_dir": out,
        "logging_dir": out / "logs",
        "render_save_dir": out / "render",
        "checkpoint_config.output_dir": out / "ckpt",
        "pretrain": out.parent / "tiny_model",
        "agentic_app.build_tiny_model": out.parent / "tiny_model",
        "save_steps": 1000,
        "agentic_app.export_hf": "false",
        **overrides,
    }
    cmd = [sys.executable, str(APP), *(f"{k}={v}" for k, v in keys.items()), *flags]
    proc = subprocess.run(cmd, cwd=out.parent, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "warm-up" in proc.stdout and "step 1/" in proc.stdout  # progress without a terminal
    return json.loads((out / "summary.json").read_text())


# Determinism needs no size: a short warm-up, 2 RL steps of 16 episodes (4 maps x 4), then the
# post-RL validation (eval_steps 2) that the comparison includes.
SHORT = {
    "max_steps": 2,
    "eval_steps": 2,
    "agentic_app.warmup.steps": 3,
    "agentic_app.warmup.episodes": 32,
    "agentic_app.warmup.batch_size": 16,
    "rollout_batch_size": 16,
    "train_env_manager.num_env_groups": 4,
    "train_env_manager.num_groups_partition": "[4]",
    "actor_train.training_args.per_device_train_batch_size": 8,
    "actor_train.training_args.gradient_accumulation_steps": 2,
    "val_env_manager.num_env_groups": 32,
    "val_env_manager.num_groups_partition": "[32]",
}


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_same_seed_same_validation_metrics(tmp_path):
    first = _run(tmp_path / "a", **SHORT)
    second = _run(tmp_path / "b", **SHORT)
    assert first["step"] == 2 and first["weight_version"] == 3  # warm-up sync + 2 RL steps
    for phase in ("eval_before", "eval_after"):
        metrics = {k: v for k, v in first[phase].items() if k.startswith("val/")}
        assert metrics and metrics == {k: second[phase][k] for k in metrics}, phase
        assert metrics["val/num_episodes"] == 32, phase
    assert first["baselines"] == second["baselines"]


# A short run on the deterministic path (lockstep agent loop, the default's seed 42, in-process
# so that a loaded machine's Ray start cannot time out): the default's warm-up (noisy expert) and
# RL settings, 40 RL steps instead of 70, sampled evaluation only, on 256 validation episodes
# (the default evaluates 1,024).
LEARN = {
    "max_steps": 40,
    "eval_steps": 40,
    "agentic_app.eval_greedy": "false",
    "val_env_manager.num_env_groups": 256,
    "val_env_manager.num_groups_partition": "[256]",
}


@pytest.mark.slow
@pytest.mark.timeout(1500)  # 398 s measured at load 2-4 on 2 cores; more on a loaded box
def test_rl_beats_the_warm_up_on_held_out_maps(tmp_path):
    """Sampled success on the held-out validation maps after RL exceeds after-warm-up (the
    policy RL starts from) by a margin well outside the evaluation noise."""
    s = _run(tmp_path / "learn", "--no-ray", **LEARN)
    gain = s["summary"]["gain val/success_rate"]
    assert s["eval_after"]["val/num_episodes"] == 256
    # Measured (2026-11-23, 2-core machine, an in-process run of this configuration evaluated
    # every 10 steps): 0.344 -> 0.477 at step 40, a gain of 0.133 = 3.09 standard errors; the
    # full default run passes through the same weights. The run is deterministic on one machine,
    # so the margin (0.033, about 0.8 standard error, above the bound) is there for another
    # machine's float rounding, not for sampling luck; the 3-seed table in docs/agentic.md is the
    # claim about other seeds. With RL disabled (rl_loss_coef=0) the weights do not move and
    # the gain is exactly 0 (measured: 0.344 -> 0.344): the assertion fails.
    assert gain["gain"] >= 0.10 and gain["gain_in_se"] >= 2.2, gain
