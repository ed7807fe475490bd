"""A real run on Ray interrupted by a signal, and a SIGKILLed Ray driver: SIGINT/SIGTERM end the
run in order (exit 130/143, no traceback, the last durable checkpoint and the command that
resumes from it printed and in summary.json); after a SIGKILL no process of its Ray session
runs a few seconds later."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "rlvr"
CONFIG = APP / "configs" / "cpu_default.yaml"


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                raw = Path(f"/proc/{name}/stat").read_bytes()
                ppid = int(raw[raw.rindex(b")") + 2 :].split()[1])
                children.setdefault(ppid, []).append(int(name))
    found, stack = set(), list(children.get(pid, []))
    while stack:
        p = stack.pop()
        if p not in found:
            found.add(p)
            stack.extend(children.get(p, []))
    return found


def _running(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw[raw.rindex(b")") + 2 :].split()[0] != b"Z"


def _wait_for_line(proc: subprocess.Popen, needle: str, timeout: float) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if needle in line or time.monotonic() > deadline:
            break
    assert any(needle in x for x in lines), "".join(lines)[-3000:]
    return lines


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_a_ray_run_in_order_and_says_how_to_resume(tmp_path, signum, code):
    out = tmp_path / "run"
    args = {
        "output_dir": out, "logging_dir": out / "logs", "checkpoint_config.output_dir": out / "ckpt",
        "pretrain": tmp_path / "tiny_model", "rlvr_app.build_tiny_model": tmp_path / "tiny_model",
        "track_with": "stdout", "max_steps": 50,
        "eval_steps": 0, "save_steps": 1, "rollout_batch_size": 4,
        "num_return_sequences_in_group": 4, "dynamic_sampling.enable": "false",
        "actor_train.training_args.per_device_train_batch_size": 8,
        "actor_train.training_args.gradient_accumulation_steps": 2, "rlvr_app.warmup.steps": 0,
    }  # fmt: skip
    argv = ["--config", str(CONFIG), *(f"{k}={v}" for k, v in args.items())]
    proc = subprocess.Popen([sys.executable, str(APP), *argv], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        _wait_for_line(proc, "step 2/50", timeout=900)
        ray_processes = _descendants(proc.pid)
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, stderr[-4000:]
    assert "Traceback" not in stderr and "Traceback" not in stdout, stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    checkpoint = summary["last_checkpoint"]
    assert summary["interrupted"] == signal.Signals(signum).name
    assert Path(checkpoint).parent == out / "ckpt" and summary["step"] >= 2
    assert Path(checkpoint).name in {f"step-{n:06d}" for n in range(2, summary["step"] + 1)}
    resume = f"uv run apps/rlvr {' '.join(argv)} resume_from_checkpoint={checkpoint}"
    assert summary["resume_command"] == resume
    assert f"last durable checkpoint: {checkpoint}" in stderr
    assert f"resume with: {resume}" in stderr
    time.sleep(5)  # workers and Ray were stopped before the driver exited
    assert [p for p in ray_processes if _running(p)] == []


DRIVER = """
import os, sys, time
from rl_runtime.cluster.ray_setup import RayOptions, start_ray
start_ray(RayOptions(num_cpus=1))
import ray

@ray.remote
class Actor:
    def pid(self):
        return os.getpid()

actor = Actor.remote()
print(ray.get(actor.pid.remote()), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_no_process_of_a_sigkilled_drivers_ray_session_outlives_it_by_seconds(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE)  # fmt: skip
    try:
        actor = int(proc.stdout.readline())  # type: ignore[union-attr]
        time.sleep(2)  # the reaper notes the session's processes (once a second)
        ray_processes = _descendants(proc.pid)
        assert actor in ray_processes and len(ray_processes) >= 5  # gcs, raylet, agents ...
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_running(p) for p in ray_processes):
            time.sleep(0.2)
        left = {p: Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in ray_processes
                if _running(p)}  # fmt: skip
        assert left == {}
    finally:
        if proc.poll() is None:
            proc.kill()
