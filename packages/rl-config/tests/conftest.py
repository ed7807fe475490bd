"""Shared fixtures of rl-config tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
SEED_YAML = DATA / "agentic_val_sokoban.yaml"


@pytest.fixture
def seed_yaml(tmp_path: Path) -> Path:
    """ROLL's agentic Sokoban YAML copied alone into an empty directory."""
    target = tmp_path / "run" / "agentic_val_sokoban.yaml"
    target.parent.mkdir()
    shutil.copy(SEED_YAML, target)
    return target


@pytest.fixture
def write_yaml(tmp_path: Path):
    """Write ``text`` to ``tmp_path/name`` (creating folders) and return the path."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    return _write
