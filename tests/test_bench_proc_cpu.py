"""tools/bench/proc_cpu.py: CPU seconds of this process tree, by role, between two marks."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.bench.proc_cpu import ProcessCpu, role_of

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass"


def test_a_busy_child_counts_as_one_core_and_a_sleeping_driver_as_none():
    with ProcessCpu(interval=0.05) as cpu:
        cpu.mark("start")
        child = subprocess.Popen([sys.executable, "-c", BURN.format(s=1.0)])
        time.sleep(0.3)  # sampled while alive, then reaped: counted once, not twice
        child.wait()
        cpu.mark("end")
    cores = cpu.cores("start", "end")
    window = cpu.marks["end"][0] - cpu.marks["start"][0]
    assert cores["other"] == pytest.approx(1.0 / window, abs=0.15)  # it burned 1.0 CPU second
    assert cores.get("driver", 0.0) < 0.2  # the driver slept and waited
    assert cores["total"] == pytest.approx(
        sum(v for k, v in cores.items() if k != "total"), abs=0.02
    )


def test_cpu_before_the_first_mark_is_not_counted():
    child = subprocess.Popen(
        [sys.executable, "-c", BURN.format(s=0.5) + "\nprint('burnt', flush=True)\ntime.sleep(5)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        # the child's burn is over before sampling starts (however loaded the machine)
        assert child.stdout.readline().strip() == "burnt"
        with ProcessCpu(interval=0.05) as cpu:
            cpu.mark("start")
            time.sleep(0.3)
            cpu.mark("end")
        assert cpu.cores("start", "end").get("other", 0.0) < 0.1
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_a_process_that_takes_its_role_after_it_started_gets_it():
    """A Ray worker retitles itself when it becomes an actor; here a child execs into a
    sandbox-looking command line after it was first sampled as "other"."""
    becomes = "import time; t = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time; time.sleep(0.4); "
            # the title is assembled in the child: its first command line must not hold it
            f"os.execv(sys.executable, [sys.executable, '-c', {becomes!r}, 'rl_envs.' + 'sandbox'])",
        ]
    )
    try:
        with ProcessCpu(interval=0.05) as cpu:
            cpu.mark("start")
            time.sleep(0.2)
            assert cpu.cpu[child.pid].role == "other"
            child.wait()
            cpu.mark("end")
    finally:
        child.kill()
        child.wait()
    cores = cpu.cores("start", "end")
    assert cores.get("reward_sandbox", 0.0) > 0.0  # the burn after the exec, under its new role


@pytest.mark.parametrize(
    ("command", "role"),
    [
        ("ray::TrainWorker.train_step", "train_worker"),
        ("ray::RolloutWorker.generate", "rollout_worker"),
        ("/x/python -m rl_envs.sandbox._worker", "reward_sandbox"),
        ("ray::IDLE", "ray_other"),
        ("/x/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name", "ray_daemons"),
        ("/usr/bin/python3 -c pass", "other"),
    ],
)
def test_roles_from_process_titles(command: str, role: str):
    assert role_of(command) == role
