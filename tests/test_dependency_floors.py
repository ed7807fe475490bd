"""Declared lower bounds cover the APIs the sources use: a user who installs one package into an
environment holding an older torch or transformers that the bound allows gets an import error or,
worse, a silently different model (transformers before 4.56 takes ``from_pretrained(dtype=...)``
as a config attribute and loads float32 whatever was asked)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]

# (pattern in a package's sources, distribution, first version that has the API, the API)
FLOORS = [
    (
        re.compile(r"from_pretrained\([^)]*\bdtype=|\{\"dtype\": dtype"),
        "transformers",
        "4.56",
        "from_pretrained(dtype=...) (transformers PR #39782; `torch_dtype` before)",
    ),
    (
        re.compile(r"from torch\.distributed\.fsdp import \(?[^)]*?\b(fully_shard|FSDPModule)\b"),
        "torch",
        "2.6",
        "torch.distributed.fsdp.fully_shard / FSDPModule (public since torch 2.6, pytorch#141868)",
    ),
]


def _packages() -> list[Path]:
    return sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())


def _declared(package_dir: Path) -> dict[str, Requirement]:
    project = tomllib.loads((package_dir / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project.get("dependencies", [])]
    return {r.name: r for r in reqs}


def floor_problems(package_dir: Path) -> list[str]:
    declared = _declared(package_dir)
    problems = []
    for pattern, dist, first, api in FLOORS:
        users = [
            p.relative_to(ROOT)
            for p in sorted((package_dir / "src").rglob("*.py"))
            if pattern.search(p.read_text())
        ]
        if not users:
            continue
        below = Version(first).release
        older = Version(".".join(map(str, (*below[:-1], below[-1] - 1))) + ".99")
        req = declared.get(dist)
        if req is None or req.specifier.contains(older, prereleases=True):
            problems.append(
                f"{package_dir.name}: {users[0]} uses {api} but declares "
                f"{req or dist + ' (nothing)'}; need {dist}>={first}"
            )
    return problems


@pytest.mark.parametrize("package_dir", _packages(), ids=lambda p: p.name)
def test_lower_bounds_cover_the_apis_used(package_dir: Path):
    problems = floor_problems(package_dir)
    assert not problems, "\n".join(problems)
