"""CI's per-package step tests the packages a change touches (`.ci/changed-packages`): the
packages with a changed file, the packages depending on them, and every package on a full run
(RL_CI_FULL=1, an unknown or week-old base, a change to a file every package reads)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "changed-packages"
# a dependency chain like the workspace's: low <- mid <- top, and one package on its own
PACKAGES = {"low": [], "mid": ["low"], "top": ["mid", "low"], "solo": []}
ALL = sorted(PACKAGES)


# uv.lock's shape: `low` needs `numpy` (and `tomli` in its `test` group), `solo` needs `regex`,
# the workspace's `dev` group `ruff`; `app-only` is what only an app needs
LOCK = """version = 1

[[package]]
name = "low"
version = "0.1.0"
dependencies = [{ name = "numpy" }]
dev-dependencies = { test = [{ name = "tomli" }] }

[[package]]
name = "solo"
version = "0.1.0"
dependencies = [{ name = "regex" }]

[[package]]
name = "rl-workspace"
source = { virtual = "." }
dev-dependencies = { dev = [{ name = "ruff" }] }

[[package]]
name = "numpy"
version = "2.0.0"

[[package]]
name = "tomli"
version = "2.0.0"

[[package]]
name = "regex"
version = "2024.1.1"

[[package]]
name = "ruff"
version = "0.8.0"

[[package]]
name = "app-only"
version = "1.0.0"
"""
ROOT_PYPROJECT = """[project]
name = "rl-workspace"
requires-python = ">=3.11"

[tool.uv.sources]
low = { workspace = true }

[tool.pytest.ini_options]
addopts = ["-ra"]
"""


def _src(name: str) -> str:
    """A source file of package `name` in the temporary workspace."""
    return f"packages/{name}/src/code.py"


def _git(repo: Path, *args: str, date: str = "2026-01-10T12:00:00") -> str:
    env = {**os.environ, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date,
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A workspace of four packages, committed once (the base); returns its root."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(SCRIPT, tmp_path / ".ci" / "changed-packages")
    for name, deps in PACKAGES.items():
        pkg = tmp_path / "packages" / name
        (pkg / "src").mkdir(parents=True)
        (pkg / "src" / "code.py").write_text("x = 1\n")
        listed = ", ".join(f'"{d}>=0.1"' for d in deps)
        (pkg / "pyproject.toml").write_text(
            f'[project]\nname = "{name}"\nversion = "0.1"\ndependencies = [{listed}]\n'
        )
    (tmp_path / "uv.lock").write_text(LOCK)
    (tmp_path / "pyproject.toml").write_text(ROOT_PYPROJECT)
    (tmp_path / "conftest.py").write_text("import pytest\n")
    (tmp_path / ".ci" / "package-test").write_text("#!/bin/sh\n")
    (tmp_path / "other").mkdir()  # outside packages/, like apps/ and tools/
    (tmp_path / "other" / "app.py").write_text("y = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "base")
    return tmp_path


def _choose(repo: Path, **env: str) -> tuple[list[str], str]:
    environ = {k: v for k, v in os.environ.items() if k not in {"RL_CI_FULL", "RL_CI_BASE"}}
    out = subprocess.run(
        [sys.executable, str(repo / ".ci" / "changed-packages")],
        cwd=repo, env={**environ, **env}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.split(), out.stderr


def _record_base(repo: Path) -> None:
    """Record HEAD as the base, the way a full run's commit is recorded."""
    (repo / ".ci" / "packages-tested-at").write_text(
        f"# every package passed alone at\n{_git(repo, 'rev-parse', 'HEAD')}\n"
    )
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "record")  # recording the base is no change of any package


def _change(repo: Path, path: str, date: str = "2026-01-11T12:00:00") -> None:
    file = repo / path
    file.write_text(file.read_text() + "# changed\n")
    _git(repo, "commit", "-qam", f"change {path}", date=date)


def test_a_change_chooses_its_package_and_the_packages_depending_on_it(repo):
    base = _git(repo, "rev-parse", "HEAD")
    _change(repo, _src("mid"))
    chosen, why = _choose(repo, RL_CI_BASE=base)
    assert chosen == ["mid", "top"], why
    assert f"mid: {_src('mid')} changed" in why
    assert "top: depends on mid" in why
    assert "low: unchanged, not tested alone" in why and "solo: unchanged" in why


def test_the_recorded_base_is_read_and_a_change_outside_packages_chooses_none(repo):
    _record_base(repo)
    assert _choose(repo)[0] == []
    _change(repo, "other/app.py")
    chosen, why = _choose(repo)
    assert chosen == [] and "2 file(s) changed since" in why, why  # the marker, the app
    _change(repo, _src("low"))
    assert _choose(repo)[0] == ["low", "mid", "top"]


def test_uncommitted_and_untracked_files_count_as_changes(repo):
    base = _git(repo, "rev-parse", "HEAD")
    (repo / "packages" / "solo" / "src" / "new.py").write_text("z = 1\n")
    assert _choose(repo, RL_CI_BASE=base)[0] == ["solo"]


def _edit(repo: Path, path: str, old: str, new: str) -> None:
    file = repo / path
    assert old in file.read_text()
    file.write_text(file.read_text().replace(old, new))
    _git(repo, "commit", "-qam", f"edit {path}", date="2026-01-11T12:00:00")


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ('version = "2.0.0"\n\n[[package]]\nname = "tomli"', 'version = "2.1.0"\n\n'
         '[[package]]\nname = "tomli"', ["low", "mid", "top"]),  # low's dependency
        ('name = "tomli"\nversion = "2.0.0"', 'name = "tomli"\nversion = "2.2.0"',
         ["low", "mid", "top"]),  # low's test group
        ('version = "2024.1.1"', 'version = "2025.1.1"', ["solo"]),
        ('version = "0.8.0"', 'version = "0.9.0"', ALL),  # the workspace's dev group
        ('version = "1.0.0"', 'version = "1.1.0"', []),  # an app's own dependency
    ],
)  # fmt: skip
def test_a_lock_change_chooses_the_packages_whose_locked_dependencies_changed(
    repo, old, new, expected
):
    base = _git(repo, "rev-parse", "HEAD")
    _edit(repo, "uv.lock", old, new)
    chosen, why = _choose(repo, RL_CI_BASE=base)
    assert chosen == expected, why
    if expected and expected != ALL:
        assert f"{expected[0]}: its locked" in why


def test_only_the_root_pyprojects_test_settings_and_groups_choose_every_package(repo):
    base = _git(repo, "rev-parse", "HEAD")
    _edit(repo, "pyproject.toml", "low = { workspace = true }",
          "low = { workspace = true }\napp = { workspace = true }")  # fmt: skip
    assert _choose(repo, RL_CI_BASE=base)[0] == []  # a new workspace member
    _edit(repo, "pyproject.toml", '["-ra"]', '["-ra", "-q"]')
    chosen, why = _choose(repo, RL_CI_BASE=base)
    assert chosen == ALL and "pyproject.toml [tool.pytest] changed" in why, why


@pytest.mark.parametrize("path", ["conftest.py", ".ci/package-test"])
def test_a_file_every_package_reads_chooses_every_package(repo, path):
    base = _git(repo, "rev-parse", "HEAD")
    _change(repo, path)
    chosen, why = _choose(repo, RL_CI_BASE=base)
    assert chosen == ALL and f"every package: {path} changed since" in why


def test_a_full_run_an_unknown_base_or_none_chooses_every_package(repo):
    base = _git(repo, "rev-parse", "HEAD")
    chosen, why = _choose(repo, RL_CI_BASE=base, RL_CI_FULL="1")
    assert chosen == ALL and "RL_CI_FULL" in why
    chosen, why = _choose(repo, RL_CI_BASE="0" * 40)
    assert chosen == ALL and "is not in this clone" in why
    chosen, why = _choose(repo)  # no RL_CI_BASE, no .ci/packages-tested-at
    assert chosen == ALL and "no base commit" in why


def test_a_base_more_than_a_week_old_is_a_weekly_full_run(repo):
    base = _git(repo, "rev-parse", "HEAD")
    _change(repo, "other/app.py", date="2026-01-17T11:00:00")  # 6.96 days later
    assert _choose(repo, RL_CI_BASE=base)[0] == []
    _change(repo, "other/app.py", date="2026-01-17T13:00:00")  # 7.04 days later
    chosen, why = _choose(repo, RL_CI_BASE=base)
    assert chosen == ALL and "weekly full run" in why, why
