"""rl_runtime's layout: a generic core and one subpackage per pipeline (the package README's tree).

The core (every module outside ``rl_runtime.pipelines`` and the command lines of ``rl_runtime.cli``)
imports no pipeline, and no pipeline imports another, at module level or lazily.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "rl_runtime"
PIPELINES = ("agentic", "rlvr", "dpo", "distill", "sft")


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _module(path: Path) -> str:
    return ".".join(("rl_runtime", *path.relative_to(SRC).with_suffix("").parts))


def test_the_core_imports_no_pipeline():
    offenders = {
        _module(path): sorted(n for n in _imported(path) if n.startswith("rl_runtime.pipelines"))
        for path in SRC.rglob("*.py")
        if path.relative_to(SRC).parts[0] not in ("pipelines", "cli")
    }
    assert {m: names for m, names in offenders.items() if names} == {}


def test_no_pipeline_imports_another():
    # the pipeline packages (a __pycache__ folder, written where bytecode is kept, is none)
    packages = [p.name for p in (SRC / "pipelines").iterdir() if (p / "__init__.py").is_file()]
    assert sorted(packages) == sorted(PIPELINES)
    offenders = {}
    for name in PIPELINES:
        for path in (SRC / "pipelines" / name).rglob("*.py"):
            others = sorted(
                n
                for n in _imported(path)
                for other in PIPELINES
                if other != name and n.startswith(f"rl_runtime.pipelines.{other}")
            )
            if others:
                offenders[_module(path)] = others
    assert offenders == {}


def test_every_folder_is_a_package():
    missing = [
        str(d.relative_to(SRC))
        for d in SRC.rglob("*")
        if d.is_dir() and d.name != "__pycache__" and not (d / "__init__.py").exists()
    ]
    assert missing == []
