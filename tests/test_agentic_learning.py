"""apps/agentic's claims on short runs of the CPU default: the same seed gives the same
validation numbers, and RL improves held-out success over the warm-up.

Both run the app as a user does (a subprocess, Ray, stdout to a pipe), scaled down by overrides.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "agentic"


def _run(out: Path, **overrides: object) -> dict:
    """One run of the default under `out`; its summary.json."""
    keys = {
        "output_dir": out,
        "logging_dir": out / "logs",
        "render_save_dir": out / "render",
        "checkpoint_config.output_dir": out / "ckpt",
        "pretrain": out.parent / "tiny_model",
        "save_steps": 1000,
        "agentic_app.export_hf": "false",
        **overrides,
    }
    cmd = [sys.executable, str(APP), *(f"{k}={v}" for k, v in keys.items())]
    proc = subprocess.run(cmd, cwd=out.parent, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "warm-up" in proc.stdout and "step 1/" in proc.stdout  # progress without a terminal
    return json.loads((out / "summary.json").read_text())


SHORT = {
    "max_steps": 2,
    "eval_steps": 2,
    "agentic_app.warmup.steps": 10,
    "agentic_app.warmup.episodes": 64,
    "val_env_manager.num_env_groups": 32,
    "val_env_manager.num_groups_partition": "[32]",
}


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_same_seed_same_validation_metrics(tmp_path):
    first = _run(tmp_path / "a", **SHORT)
    second = _run(tmp_path / "b", **SHORT)
    for phase in ("eval_before", "eval_after"):
        metrics = {k: v for k, v in first[phase].items() if k.startswith("val/")}
        assert metrics and metrics == {k: second[phase][k] for k in metrics}, phase
    assert first["baselines"] == second["baselines"]
