"""docs/ascend.md's install recipe, run as written where it can run on the CPU: a "vendor"
environment (Python 3.10 with vllm-ascend 0.11's torch 2.7.1, transformers 4.57.1 and numpy 1.x;
no NPU, so no torch_npu, vLLM or CANN) gets the packages with the recipe's own commands (pip with
the vendor pins as constraints, `pip check`, `rl-doctor --config ...`); the vendor packages must be
left as they were. Needs the registry and a pip-seeded Python 3.10 (pyenv or `uv python find`):
`slow`, which CI's slow step runs.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
RECIPE_DOC = ROOT / "docs" / "ascend.md"
VENDOR = {"torch": "2.7.1", "transformers": "4.57.1", "numpy": "1.26.4"}


def _uv() -> list[str]:
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


def _python_310() -> str | None:
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    found = sorted(glob.glob(f"{root}/versions/3.10.*/bin/python3.10"))
    if found:
        return found[-1]
    done = subprocess.run([*_uv(), "python", "find", "--no-config", "3.10"],
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip() or None if done.returncode == 0 else None


def recipe_commands(text: str) -> list[str]:
    """The doc's install block, without its `git clone ... && cd ...` line (the test runs in a
    copy of the checkout)."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert blocks, f"{RECIPE_DOC} has no ```bash block"
    lines = blocks[0].replace("\\\n", " ").splitlines()
    return [line for line in lines if line.strip() and not line.startswith("git clone")]


def test_the_recipe_block_is_the_pip_install_with_vendor_constraints() -> None:
    commands = recipe_commands(RECIPE_DOC.read_text())
    assert commands[0].startswith("pip freeze") and "> vendor.txt" in commands[0]
    assert commands[1].startswith("pip install -c vendor.txt ./packages/rl-config")
    assert commands[-1].startswith("pip check && rl-doctor --config ")


def test_the_recipe_installs_into_a_vendor_environment_and_leaves_it_untouched(tmp_path) -> None:
    python = _python_310()
    if python is None:
        pytest.skip("no Python 3.10 (pyenv or uv python find)")
    env = tmp_path / "vendor"
    subprocess.run([*_uv(), "venv", "--quiet", "--no-config", "--seed", "--python", python,
                    str(env)], check=True)  # fmt: skip
    subprocess.run([*_uv(), "pip", "install", "--quiet", "--no-config", "--python",
                    str(env / "bin" / "python"), *(f"{n}=={v}" for n, v in VENDOR.items())],
                   check=True)  # fmt: skip
    checkout = tmp_path / "rl-stack"
    ignore = shutil.ignore_patterns("__pycache__", ".venv*", "*.egg-info", "build", "dist")
    shutil.copytree(ROOT / "packages", checkout / "packages", ignore=ignore)
    shutil.copytree(ROOT / "apps", checkout / "apps", ignore=ignore)
    script = "set -euo pipefail\n" + "\n".join(recipe_commands(RECIPE_DOC.read_text())) + "\n"
    environ = {**os.environ, "PATH": f"{env / 'bin'}:{os.environ['PATH']}",
               "VIRTUAL_ENV": str(env), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # fmt: skip
    for name in ("PYTHONPATH", "UV_PROJECT_ENVIRONMENT"):
        environ.pop(name, None)
    done = subprocess.run(["bash", "-c", script], cwd=checkout, env=environ,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "[ok] device: cpu" in done.stdout and "0 error(s)" in done.stdout, done.stdout
    assert "versions: torch 2.7.1" in done.stdout
    frozen = subprocess.run([str(env / "bin" / "python"), "-m", "pip", "freeze"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    for name, version in VENDOR.items():
        assert f"{name}=={version}" in frozen.splitlines(), f"{name} was changed:\n{frozen}"
    assert "rl-runtime @ " in frozen or "rl_runtime @ " in frozen
