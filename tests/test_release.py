"""The per-package release tool: version bumps, tag checks, and clean-venv verification."""

from __future__ import annotations

import datetime as dt
import shutil
import textwrap
import tomllib
from pathlib import Path

import pytest

from tools import release

ROOT = Path(__file__).resolve().parents[1]


def _fake_package(packages: Path, name: str, deps: list[str], source: str, version="0.1.0") -> Path:
    pkg = packages / name
    module = name.replace("-", "_")
    (pkg / "src" / module).mkdir(parents=True)
    (pkg / "src" / module / "__init__.py").write_text(source)
    (pkg / "README.md").write_text(f"# {name}\n")
    (pkg / "LICENSE").write_text("Apache License, Version 2.0\n")
    (pkg / "CHANGELOG.md").write_text(f"# Changelog of {name}\n\n## {version}\n\n- First.\n")
    deps_toml = ", ".join(f'"{d}"' for d in deps)
    (pkg / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""\
            [project]
            name = "{name}"
            version = "{version}"
            requires-python = ">=3.11"
            readme = "README.md"
            license = "Apache-2.0"
            license-files = ["LICENSE"]
            dependencies = [{deps_toml}]

            [build-system]
            requires = ["uv_build>=0.9,<0.14"]
            build-backend = "uv_build"
            """
        )
    )
    return pkg


def test_bump_sets_version_and_opens_a_changelog_section(tmp_path):
    pkg = _fake_package(tmp_path, "demo-pkg", [], "")
    new = release.bump(pkg, "minor", ["Added X.", "Fixed Y."], today=dt.date(2026, 1, 2))
    assert new == "0.2.0"
    assert release.read_version(pkg) == "0.2.0"
    changelog = (pkg / "CHANGELOG.md").read_text()
    assert changelog.index("## 0.2.0 (2026-01-02)") < changelog.index("## 0.1.0")
    assert "- Added X.\n- Fixed Y." in changelog
    assert release.next_version("1.2.3", "patch") == "1.2.4"
    assert release.next_version("1.2.3", "major") == "2.0.0"
    with pytest.raises(release.ReleaseError, match="already at"):
        release.bump(pkg, "0.2.0", ["again"])
    with pytest.raises(release.ReleaseError, match="CHANGELOG line"):
        release.bump(pkg, "patch", [])


def test_check_tag_requires_matching_version_and_changelog(tmp_path):
    pkg = _fake_package(tmp_path, "demo-pkg", [], "", version="0.3.0")
    assert release.check_tag("demo-pkg/v0.3.0", tmp_path) == pkg
    with pytest.raises(release.ReleaseError, match="has version 0.3.0"):
        release.check_tag("demo-pkg/v0.3.1", tmp_path)
    with pytest.raises(release.ReleaseError, match="unknown package"):
        release.check_tag("nope/v0.3.0", tmp_path)
    with pytest.raises(release.ReleaseError, match="not of the form"):
        release.check_tag("demo-pkg-0.3.0", tmp_path)
    (pkg / "CHANGELOG.md").write_text("# Changelog\n")
    with pytest.raises(release.ReleaseError, match="no '## 0.3.0' entry"):
        release.check_tag("demo-pkg/v0.3.0", tmp_path)


def test_workspace_deps_are_transitive():
    deps = {p.name for p in release.workspace_deps(ROOT / "packages" / "rl-runtime")}
    assert {"rl-config", "rl-algos", "rl-envs", "rl-sync", "rl-rollout", "rl-train"} <= deps
    assert release.workspace_deps(ROOT / "packages" / "rl-algos") == []


@pytest.mark.xdist_group("release")
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv not on PATH")
def test_verify_fails_on_an_undeclared_dependency_and_passes_once_declared(tmp_path):
    source = "import yaml\n\nVALUE = yaml.safe_load('a: 1')['a']\n"
    bad = _fake_package(tmp_path / "bad", "leaky-pkg", [], source)
    with pytest.raises(release.ReleaseError, match="yaml"):
        release.verify(bad, tmp_path / "work-bad", constraints=[])
    good = _fake_package(tmp_path / "good", "leaky-pkg", ["pyyaml>=6"], source)
    report = release.verify(good, tmp_path / "work-good", constraints=[])
    assert report["ok"] == ["leaky_pkg"]


@pytest.mark.slow
@pytest.mark.xdist_group("release")
@pytest.mark.parametrize("name", ["rl-config", "rl-envs", "rl-algos"])
def test_light_packages_verify_in_a_clean_venv(name, tmp_path):
    report = release.verify(ROOT / "packages" / name, tmp_path)
    assert name.replace("-", "_") in report["ok"]


def test_every_package_ships_its_license_file():
    """Apache-2.0 asks that the license text travel with the code: each package declares a
    license file that exists (uv_build then puts it in the wheel's .dist-info/licenses/)."""
    for pkg in sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists()):
        project = tomllib.loads((pkg / "pyproject.toml").read_text())["project"]
        assert project.get("license") == "Apache-2.0", pkg.name
        files = project.get("license-files", [])
        assert files, f"{pkg.name}: no license-files in pyproject.toml"
        assert all((pkg / f).is_file() for f in files), f"{pkg.name}: {files} missing"
        assert "Apache License" in (pkg / files[0]).read_text()


@pytest.mark.xdist_group("release")
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv not on PATH")
def test_verify_refuses_a_wheel_without_its_license(tmp_path):
    pkg = _fake_package(tmp_path, "bare-pkg", [], "VALUE = 1\n")
    text = (pkg / "pyproject.toml").read_text().replace('license-files = ["LICENSE"]\n', "")
    (pkg / "pyproject.toml").write_text(text)
    (pkg / "LICENSE").unlink()
    with pytest.raises(release.ReleaseError, match="holds no license file"):
        release.verify(pkg, tmp_path / "work", constraints=[])
    wheel = release.build(ROOT / "packages" / "rl-algos", tmp_path / "dist")
    release.check_wheel_contents(wheel)  # the real package passes


def test_bump_moves_the_unreleased_entries_into_the_new_version(tmp_path):
    pkg = _fake_package(tmp_path, "demo-pkg", [], "")
    (pkg / "CHANGELOG.md").write_text(
        "# Changelog\n\n## Unreleased\n\n- Added Z.\n  (two lines)\n\n## 0.1.0\n\n- First.\n"
    )
    assert release.bump(pkg, "patch", ["Fixed Y."], today=dt.date(2026, 1, 2)) == "0.1.1"
    assert (pkg / "CHANGELOG.md").read_text() == (
        "# Changelog\n\n## Unreleased\n\n## 0.1.1 (2026-01-02)\n\n- Fixed Y.\n- Added Z.\n"
        "  (two lines)\n\n## 0.1.0\n\n- First.\n"
    )
    release.check_tag("demo-pkg/v0.1.1", tmp_path)
    # no -m: the Unreleased entries are the notes; none at all is refused
    (pkg / "CHANGELOG.md").write_text("# Changelog\n\n## Unreleased\n\n- Only.\n\n## 0.1.1\n")
    assert release.bump(pkg, "patch", [], today=dt.date(2026, 1, 3)) == "0.1.2"
    assert "## 0.1.2 (2026-01-03)\n\n- Only.\n\n## 0.1.1" in (pkg / "CHANGELOG.md").read_text()
    with pytest.raises(release.ReleaseError, match="or entries under '## Unreleased'"):
        release.bump(pkg, "patch", [])


def test_a_pending_first_version_is_dated_in_place_and_tagged_only_then(tmp_path):
    pkg = _fake_package(tmp_path, "demo-pkg", [], "")
    (pkg / "CHANGELOG.md").write_text(
        "# Changelog\n\n## Unreleased\n\n- Late fix.\n\n## 0.1.0 (unreleased)\n\n- First.\n"
    )
    with pytest.raises(release.ReleaseError, match="still calls 0.1.0 unreleased"):
        release.check_tag("demo-pkg/v0.1.0", tmp_path)
    assert release.bump(pkg, "0.1.0", [], today=dt.date(2026, 1, 2)) == "0.1.0"
    assert (pkg / "CHANGELOG.md").read_text() == (
        "# Changelog\n\n## Unreleased\n\n## 0.1.0 (2026-01-02)\n\n- Late fix.\n\n- First.\n"
    )
    release.check_tag("demo-pkg/v0.1.0", tmp_path)
    (pkg / "CHANGELOG.md").write_text(
        (pkg / "CHANGELOG.md").read_text().replace("## Unreleased\n", "## Unreleased\n\n- New.\n")
    )
    with pytest.raises(release.ReleaseError, match="entries under '## Unreleased' that would ship"):
        release.check_tag("demo-pkg/v0.1.0", tmp_path)
