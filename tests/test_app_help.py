"""`uv run apps/X --help` says what the app does (its spec module's docstring), not only its options."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("app", ["agentic", "rlvr", "dpo", "async", "distill", "sft"])
def test_help_describes_the_app(app):
    spec = ROOT / "apps" / app / "src" / f"rl_app_{app}" / "spec.py"  # what __main__.py runs
    doc = ast.get_docstring(ast.parse(spec.read_text()))
    assert doc
    result = subprocess.run(
        [sys.executable, str(ROOT / "apps" / app), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: apps/{app}")
    assert doc.splitlines()[0] in result.stdout and doc.splitlines()[2] in result.stdout
    assert "Traceback" not in result.stderr
