"""CI guards that live in the workspace's root conftest.py, run in a real pytest subprocess.

CI's vLLM step sets ``RL_REQUIRE_VLLM=1``: there a skipped ``vllm`` test (vllm not importable) and a
session without a passing ``vllm`` test are failures, not a green step.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TESTS = """
import pytest

@pytest.mark.vllm
def test_needs_vllm():
    pytest.importorskip("rl_module_that_is_not_installed")

@pytest.fixture
def engine():
    pytest.importorskip("rl_module_that_is_not_installed")

@pytest.mark.vllm
def test_needs_an_engine(engine):
    pass

def test_plain():
    pass
"""


def _pytest(tmp_path: Path, require: str | None, *args: str) -> subprocess.CompletedProcess:
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    vllm: needs vLLM\n")
    (tmp_path / "test_guarded.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if k != "RL_REQUIRE_VLLM"}
    if require is not None:
        env["RL_REQUIRE_VLLM"] = require
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_the_variable_vllm_tests_skip(tmp_path):
    out = _pytest(tmp_path, None, "-m", "vllm")
    assert out.returncode == 0, out.stdout
    assert "2 skipped" in out.stdout


def test_required_vllm_turns_skips_in_tests_and_fixtures_into_failures(tmp_path):
    out = _pytest(tmp_path, "1", "-m", "vllm", "-rA")
    assert out.returncode == 1, out.stdout
    assert "1 failed, 1 deselected, 1 error" in out.stdout, out.stdout
    assert "RL_REQUIRE_VLLM=1 but this vllm test was skipped (call)" in out.stdout
    assert "RL_REQUIRE_VLLM=1 but this vllm test was skipped (setup)" in out.stdout
    assert "rl_module_that_is_not_installed" in out.stdout


def test_required_vllm_fails_a_session_with_no_vllm_test(tmp_path):
    out = _pytest(tmp_path, "1", "-m", "not vllm")
    assert out.returncode == 1, out.stdout
    assert "1 passed" in out.stdout
    assert "RL_REQUIRE_VLLM=1 but no vllm test passed in this session" in out.stdout


def test_required_vllm_leaves_other_skips_alone(tmp_path):
    (tmp_path / "test_other.py").write_text(
        "import pytest\n\n@pytest.mark.vllm\ndef test_ok():\n    pass\n\n"
        "def test_skipped():\n    pytest.skip('not about vllm')\n"
    )
    out = _pytest(tmp_path, "1", "test_other.py")
    assert out.returncode == 0, out.stdout
    assert "1 passed, 1 skipped" in out.stdout


@pytest.mark.parametrize("value", ["yes", "2"])
def test_a_malformed_value_is_a_usage_error(tmp_path, value):
    out = _pytest(tmp_path, value)
    assert out.returncode == 4, out.stdout + out.stderr
    assert f"RL_REQUIRE_VLLM={value!r}: expected 0 or 1" in out.stdout + out.stderr


def test_the_github_package_matrix_covers_every_package_with_the_ci_script():
    import yaml

    workflow = yaml.safe_load((ROOT / ".github/workflows/ci.yml").read_text())
    job = workflow["jobs"]["package"]
    packages = sorted(
        p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists()
    )
    assert sorted(job["strategy"]["matrix"]["package"]) == packages
    commands = [step.get("run", "") for step in job["steps"]]
    assert "bash .ci/package-test ${{ matrix.package }}" in commands
    assert ".ci/package-test" in (ROOT / ".ci/run").read_text()
