"""CI's heavy steps end within CI's time limit: ``RL_TEST_DEADLINE`` (root conftest.py) skips the
tests that would start after it, says so, and leaves every test that ran to pass or fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TESTS = """
import pytest

def test_fails():
    assert False

@pytest.mark.vllm
def test_vllm_marked():
    pass
"""


def _run(tmp_path: Path, deadline: float | None, *, require_vllm: bool = False) -> str:
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_budget.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    vllm: vllm\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RL_")}
    if deadline is not None:
        env["RL_TEST_DEADLINE"] = str(deadline)
    if require_vllm:
        env["RL_REQUIRE_VLLM"] = "1"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rs", "-q"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout + out.stderr


def test_tests_after_the_deadline_are_skipped_and_counted(tmp_path):
    out = _run(tmp_path, time.time() - 1)
    assert "2 skipped" in out, out
    assert "RL_TEST_DEADLINE: 2 test(s) not run, the step's time budget ran out" in out, out


def test_before_the_deadline_tests_run_and_fail_as_usual(tmp_path):
    out = _run(tmp_path, time.time() + 600)
    assert "1 failed, 1 passed" in out, out
    assert "not run" not in out, out


def test_a_deadline_skip_is_not_a_missing_vllm(tmp_path):
    # RL_REQUIRE_VLLM turns skipped vllm tests into failures; a budget skip stays a skip (the
    # session still fails because no vllm test passed, which the step must then explain).
    out = _run(tmp_path, time.time() - 1, require_vllm=True)
    assert "2 skipped" in out and "was skipped" not in out, out


def test_a_malformed_deadline_is_a_usage_error(tmp_path):
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    env = {**os.environ, "RL_TEST_DEADLINE": "soon"}
    bad = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "expected unix seconds" in bad.stdout + bad.stderr
