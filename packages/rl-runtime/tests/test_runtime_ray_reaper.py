"""rl_runtime.cluster.ray_reaper with real processes standing in for a Ray session (no Ray): a driver,
its child naming the session directory (the raylet), and that child's child (an agent the
raylet started, which Ray does not tie to the driver)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")

DRIVER = """
import subprocess, sys, time
from rl_runtime.cluster.ray_reaper import start_reaper
session, end_raylet = sys.argv[1], sys.argv[2] == "1"
raylet = subprocess.Popen([sys.executable, "-c", '''
import subprocess, sys, time
agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(agent.pid, flush=True)
time.sleep(120)
''', session], stdout=subprocess.PIPE, text=True)
agent = int(raylet.stdout.readline())
reaper = start_reaper(session)
print(raylet.pid, agent, reaper.pid, flush=True)
time.sleep(2.5)  # the reaper notes the session
if end_raylet:  # ray.shutdown: the session's own processes end, the driver goes on
    raylet.kill()
    raylet.wait()
time.sleep(120)
"""


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its parent's wait does not)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw[raw.rindex(b")") + 2 :].split()[0] != b"Z"


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _kill_left(*pids: int) -> None:
    for pid in pids:
        if _running(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _start(tmp_path, end_raylet: bool) -> tuple[subprocess.Popen, list[int]]:
    session = str(tmp_path / "session_2026-01-01_00-00-00_000000_1")
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, session, "1" if end_raylet else "0"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    pids = [int(x) for x in driver.stdout.readline().split()]  # type: ignore[union-attr]
    return driver, pids


def test_a_sigkilled_drivers_session_processes_are_killed_within_seconds(tmp_path):
    driver, (raylet, agent, reaper) = _start(tmp_path, end_raylet=False)
    try:
        time.sleep(2.0)  # noted
        driver.kill()
        driver.wait()
        assert _gone(agent, 5.0), "the raylet's child outlived the driver"
        assert _gone(raylet, 5.0)
        assert _gone(reaper, 5.0)  # and the reaper ends
    finally:
        _kill_left(raylet, agent, reaper)


def test_when_the_session_ends_its_leftovers_are_killed_and_the_driver_goes_on(tmp_path):
    driver, (raylet, agent, reaper) = _start(tmp_path, end_raylet=True)
    try:
        assert _gone(agent, 8.0), "an orphan of the ended session is still running"
        assert _gone(reaper, 5.0)
        assert driver.poll() is None  # the driver itself is left alone
    finally:
        driver.kill()
        driver.wait()
        _kill_left(raylet, agent, reaper)
