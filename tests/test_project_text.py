"""Project text a reader can follow: no file it cites is missing, no reference it cannot open.

Scans every tracked text file (sources, tests, tools, READMEs, CHANGELOGs, configs, docs/) except
data recorded from upstream projects (ROLL's and verl's configs, kept byte for byte):
- no mention of tracker numbers or private planning documents (`BANNED`);
- every repository path it names (`packages/...`, `apps/...`, `tools/...`, `tests/...`, `docs/...`,
  `.ci/...`, a package's `src/...`), every upper-case `NAME.md` and every relative Markdown link
  exists. A path resolves against the repository root, the citing file's package, or the citing
  file's folder.
- every dotted module path of this workspace it names (`rl_runtime.compose.rlvr`,
  `rl_rollout.tiny_model.build_tiny_model`) exists: a module or package, then, if more follows, a
  name the module defines. CHANGELOGs are exempt (they record where things were).
Runs in a second or two; nothing is imported (module files are parsed).
"""

from __future__ import annotations

import ast
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS = "tests/test_project_text.py"
VENDORED = ("packages/rl-config/tests/data/",)
TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".sh", ".json", ""}

# The patterns are spelled in pieces so that this file does not match itself.
BANNED = {
    "a numbered requirement note": re.compile(r"\bseeds?[ _-]?0\d\d\b", re.IGNORECASE),
    "an issue number": re.compile(r"\bissues?[ _-]?#?\d+", re.IGNORECASE),
    "the user's private notes": re.compile(r"\buser'?s (?:own )?" + "notes", re.IGNORECASE),
    "the private requirement notes": re.compile(r"\bfrom the " + r"seeds\b"),
    "the private notes folder": re.compile(r"\bshared/" + "seeds"),
}
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:packages|apps|tools|tests|docs|src|\.ci|\.github)/[\w./-]*\w)"
)
UPPER_MD = re.compile(r"(?<![\w./-])([A-Z][A-Z_]+\.md)\b")
MD_LINK = re.compile(r"\]\(([^)#\s]+)")
# Placeholders that name no file: `apps/X`, `apps/demo` in examples of error messages.
PLACEHOLDER = re.compile(r"^apps/(?:x|X|demo|<name>)$")
# Every package and app has these: the name alone means "the one of the package in question".
GENERIC = {"README.md", "CHANGELOG.md"}


# Workspace packages by import name: the libraries and the apps.
PACKAGES = {
    p.name: p
    for pattern in ("packages/*/src/rl_*", "apps/*/src/rl_app_*")
    for p in ROOT.glob(pattern)
}
MODULE_PATH = re.compile(r"(?<![\w.])((?:" + "|".join(sorted(PACKAGES)) + r")(?:\.\w+)+)")
# Dotted names that are not module paths: entry-point groups.
NOT_MODULES = {"rl_config.deep_check"}


def _tracked() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [f for f in out.split("\0") if f]


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    files = {}
    for name in _tracked():
        path = ROOT / name
        if name == THIS or name.startswith(VENDORED) or path.suffix not in TEXT_SUFFIXES:
            continue
        if not path.is_file() or name == "uv.lock":
            continue
        try:
            files[name] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return files


def _package_root(name: str) -> Path:
    parts = Path(name).parts
    if len(parts) > 2 and parts[0] in ("packages", "apps"):
        return ROOT / parts[0] / parts[1]
    return ROOT


def _exists(ref: str, citing: str) -> bool:
    ref = ref.rstrip("./")
    bases = (ROOT, _package_root(citing), (ROOT / citing).parent)
    for base in bases:
        if (base / ref).exists():
            return True
        # `tools/bench/grpo_step.step_gflop`: a module's attribute
        stem, dot, _ = ref.rpartition(".")
        if dot and (base / (stem + ".py")).exists():
            return True
    return False


ANCHORED_LINK = re.compile(r"\]\(([^)#\s]*)#([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # a `# comment` in a code block is no heading
    return frozenset(slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M))


def missing_anchors(name: str, text: str) -> list[str]:
    """`file:line: link` for each `[..](page.md#anchor)` whose page has no such heading."""
    if not name.endswith(".md"):
        return []
    out = []
    for m in ANCHORED_LINK.finditer(text):
        target = (ROOT / name).parent / m.group(1) if m.group(1) else ROOT / name
        if target.suffix == ".md" and target.is_file() and m.group(2) not in anchors(target):
            out.append(f"{name}:{_line(text, m)}: {m.group(1)}#{m.group(2)}")
    return out


def _line(text: str, match: re.Match[str]) -> int:
    return text.count("\n", 0, match.start()) + 1


def missing_references(name: str, text: str) -> list[str]:
    """`file:line: reference` for each path in `text` that names nothing in the repository."""
    matches = [*REPO_PATH.finditer(text), *UPPER_MD.finditer(text)]
    if name.endswith(".md"):
        matches += [m for m in MD_LINK.finditer(text) if ":" not in m.group(1).split("/")[0]]
    return [
        f"{name}:{_line(text, m)}: {m.group(1)}"
        for m in matches
        if m.group(1) not in GENERIC
        and not PLACEHOLDER.match(m.group(1))
        and not text.startswith("<", m.end())  # `src/rl_app_<name>/`: a pattern, not a path
        and not _exists(m.group(1), name)
    ]


@cache
def _names_defined(path: Path) -> frozenset[str]:
    """Top-level and nested names a module file defines or imports (parsed, not imported)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return frozenset()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def module_exists(dotted: str) -> bool:
    """`rl_x.a.b.c`: packages `a`, `b` ... as far as they are folders, then a module file or a
    name the package's `__init__.py` defines; a dunder (`__file__`) always exists."""
    parts = dotted.split(".")
    base, i = PACKAGES[parts[0]], 1
    while i < len(parts) and (base / parts[i]).is_dir():
        base, i = base / parts[i], i + 1
    if i == len(parts) or parts[i].startswith("__"):
        return True
    if (base / f"{parts[i]}.py").is_file():
        if i + 1 == len(parts) or parts[i + 1].startswith("__"):
            return True
        return parts[i + 1] in _names_defined(base / f"{parts[i]}.py")
    return parts[i] in _names_defined(base / "__init__.py")


def missing_modules(name: str, text: str) -> list[str]:
    """`file:line: module` for each workspace module path in `text` that does not exist."""
    if name.endswith("CHANGELOG.md"):
        return []
    return [
        f"{name}:{_line(text, m)}: {m.group(1)}"
        for m in MODULE_PATH.finditer(text)
        if m.group(1) not in NOT_MODULES and not module_exists(m.group(1))
    ]


def banned_mentions(name: str, text: str) -> list[str]:
    """`file:line: what (text)` for each mention of a number or note a reader cannot open."""
    return [
        f"{name}:{_line(text, m)}: {what} ({m.group(0)!r})"
        for what, pattern in BANNED.items()
        for m in pattern.finditer(text)
    ]


def test_no_reference_to_a_missing_file(texts: dict[str, str]) -> None:
    found = [hit for name, text in texts.items() for hit in missing_references(name, text)]
    assert not found, "references to files that do not exist:\n" + "\n".join(found)


def test_no_link_to_a_missing_heading(texts: dict[str, str]) -> None:
    found = [hit for name, text in texts.items() for hit in missing_anchors(name, text)]
    assert not found, "links to headings that do not exist:\n" + "\n".join(found)


def test_no_reference_to_a_missing_module(texts: dict[str, str]) -> None:
    found = [hit for name, text in texts.items() for hit in missing_modules(name, text)]
    assert not found, (
        "module paths that do not exist (moved or renamed? name the new place):\n"
        + "\n".join(found)
    )


def test_no_tracker_or_private_note_numbers(texts: dict[str, str]) -> None:
    found = [hit for name, text in texts.items() for hit in banned_mentions(name, text)]
    assert not found, (
        "project text names things a reader cannot open (say what is meant instead):\n"
        + "\n".join(found)
    )


def test_the_checks_catch_what_they_are_for() -> None:
    """Each check flags its pattern and passes the lookalikes the project uses."""
    readme = "packages/rl-runtime/README.md"
    assert missing_references(readme, "aligned per CONTRACT.md") == [f"{readme}:1: CONTRACT.md"]
    assert missing_references(readme, "see [x](../../docs/nowhere.md)") != []
    assert missing_references(readme, "`tests/test_runtime_nowhere.py`") != []
    assert missing_references(readme, "see CHANGELOG.md, `src/rl_runtime`, `apps/X`") == []
    assert missing_references(readme, "`tests/test_runtime_compose.py`") == []
    assert missing_references("README.md", "the package src/rl_app_<name>/ of each app") == []
    assert missing_references("README.md", "[rl-algos](packages/rl-algos/README.md)") == []
    assert missing_references("README.md", "[uv](https://docs.astral.sh/uv/)") == []
    bad = [
        "seed" + " 000's YAML",
        "Seed" + "003",
        "issue" + " 12",
        "(issue" + " #14)",
        "issue" + "-15",
    ]
    for text in bad:
        assert banned_mentions("x.md", text), text
    fine = ["seed 42", "seeds 1, 2, 3", "whatever the seeds;", "an issue about a key", "seed 0"]
    for text in fine:
        assert not banned_mentions("x.md", text), text
