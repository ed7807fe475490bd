"""The packages' metadata is satisfiable together with torch-npu and vllm-ascend as published on the
package registry, for Linux aarch64 and x86_64, without installing anything (`uv pip compile`
against the registry: needs the network, hence `slow`, which CI's slow step runs).

Two stands-ins, both for packages that Ascend's own channels ship and the registry does not:
- x86_64 torch-npu pins ``torch==X+cpu`` (PyTorch's CPU index); ``torch==X`` stands in for it.
- vllm-ascend 0.23.0 pins ``triton-ascend==3.2.2`` (the registry has 3.2.0 only): left out.
vLLM itself is not resolved: on Ascend it is built from source with ``VLLM_TARGET_DEVICE=empty``
(the registry's vllm wheels pin a CUDA torch that no torch-npu pairs with).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [
    "rl-config",
    "rl-algos",
    "rl-envs",
    "rl-sync",
    "rl-rollout",
    "rl-train[deepspeed]",
    "rl-runtime",
]

STACKS = {
    # the verl-on-Ascend recipe's stack (Python 3.10, vllm-ascend 0.11)
    "vllm-ascend-0.11": ("3.10", {"torch": "2.7.1", "torch-npu": "2.7.1", "vllm-ascend": "0.11.0"}, []),
    # verl's current Ascend guide (Python 3.12, vllm-ascend 0.23)
    "vllm-ascend-0.23": ("3.12", {"torch": "2.10.0", "torch-npu": "2.10.0.post4", "vllm-ascend": "0.23.0"},
                         ['triton-ascend ; python_version < "0"']),
}  # fmt: skip


def _uv() -> list[str]:
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


@pytest.mark.parametrize("platform", ["aarch64-manylinux_2_28", "x86_64-manylinux_2_28"])
@pytest.mark.parametrize("stack", sorted(STACKS))
def test_packages_resolve_with_the_published_ascend_stack(stack, platform, tmp_path) -> None:
    python, pins, dropped = STACKS[stack]
    requirements = tmp_path / "requirements.in"
    requirements.write_text(
        "\n".join([*(f"{ROOT / 'packages' / p.split('[')[0]}{p[len(p.split('[')[0]):]}" for p in PACKAGES),
                   *(f"{name}=={version}" for name, version in pins.items())]) + "\n"
    )  # fmt: skip
    overrides = tmp_path / "overrides.txt"
    overrides.write_text("\n".join([f"torch=={pins['torch']}", *dropped]) + "\n")
    out = tmp_path / "resolved.txt"
    done = subprocess.run(
        [*_uv(), "pip", "compile", "--no-config", "--quiet", "--python-version", python,
         "--python-platform", platform, str(requirements), "--override", str(overrides),
         "-o", str(out)],
        capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    resolved = dict(
        line.split("==", 1)
        for line in out.read_text().splitlines()
        if "==" in line and not line.startswith(" ")
    )
    for name, version in pins.items():
        assert resolved.get(name) == version, (name, resolved.get(name))
    assert all(name.split("[")[0] in out.read_text() for name in PACKAGES)
