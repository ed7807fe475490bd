"""The dependency rule (root README "Packages"), enforced on the sources.

For every package: each top-level module its ``src/`` imports (at module level or lazily inside a
function) is the package itself, the standard library, or a distribution the package declares
(dependencies or optional extras), and never one the dependency rule forbids. Its ``tests/`` may
import, in addition, what its own dependency groups declare and the workspace's dev tools (the root
``dev`` group): what CI's per-package step (.ci/package-test) installs. And the light packages stay
light at import time in a fresh interpreter.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"

# The dependency rule: which workspace packages and frameworks each package may import.
WORKSPACE = {"rl_config", "rl_algos", "rl_envs", "rl_sync", "rl_rollout", "rl_train", "rl_runtime"}
HEAVY = {"torch", "transformers", "ray", "vllm", "deepspeed", "peft", "torch_npu", "vllm_ascend"}
ALLOWED = {
    "rl-config": set(),
    "rl-algos": {"torch"},
    "rl-envs": set(),
    "rl-sync": {"torch", "torch_npu"},
    "rl-rollout": {"rl_config", "rl_envs", "rl_sync", "torch", "transformers", "vllm", "torch_npu"},
    "rl-train": {"rl_config", "rl_algos", "rl_sync", "torch", "transformers", "deepspeed", "peft"},
    "rl-runtime": WORKSPACE | {"torch", "transformers", "ray"},
}
# Platform plugins installed from vendor channels on their hosts, never declared.
VENDOR_CHANNEL = {"torch_npu", "vllm_ascend"}


def _requirement_name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;@]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def declared_distributions(pyproject: Path) -> set[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs.extend(extra)
    return {_requirement_name(r) for r in reqs}


def group_distributions(pyproject: Path, groups: list[str] | None = None) -> set[str]:
    """Distributions of the dependency groups ``groups`` (all of them when None)."""
    declared = tomllib.loads(pyproject.read_text()).get("dependency-groups", {})
    names = declared if groups is None else groups
    return {_requirement_name(r) for name in names for r in declared[name] if isinstance(r, str)}


def declared_test_distributions(package_dir: Path) -> set[str]:
    """What a package's tests may import: its dependencies, extras, groups and the dev tools."""
    pyproject = package_dir / "pyproject.toml"
    return (
        declared_distributions(pyproject)
        | group_distributions(pyproject)
        | group_distributions(ROOT / "pyproject.toml", ["dev"])
    )


def imported_top_level_modules(source: str) -> set[str]:
    """Top-level names of every absolute import in ``source`` (lazy ones included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def boundary_violations(
    package: str,
    module: str,
    imports: set[str],
    declared: set[str],
    allowed: set[str] | None = None,
) -> list[str]:
    """Human-readable violations of the rule for one package's set of imported modules.

    ``allowed``: the workspace and heavy modules it may import (the rule's ``ALLOWED[package]``
    unless given)."""
    allowed = ALLOWED[package] if allowed is None else allowed
    dists_of = packages_distributions()
    problems = []
    for name in sorted(imports - {module} - set(sys.stdlib_module_names) - {"__future__"}):
        if (name in WORKSPACE or name in HEAVY) and name not in allowed:
            problems.append(f"{package} imports {name}: forbidden by the dependency rule")
            continue
        if name in VENDOR_CHANNEL:
            continue
        dists = {d.lower().replace("_", "-") for d in dists_of.get(name, [name.replace("_", "-")])}
        if not dists & declared:
            problems.append(f"{package} imports {name} but declares none of {sorted(dists)}")
    return problems


def _packages() -> list[Path]:
    return sorted(p for p in PACKAGES.iterdir() if (p / "pyproject.toml").exists())


def test_every_package_of_the_design_exists():
    assert {p.name for p in _packages()} == set(ALLOWED)


@pytest.mark.parametrize("package_dir", _packages(), ids=lambda p: p.name)
def test_imports_respect_declared_dependencies_and_the_rule(package_dir: Path):
    module = package_dir.name.replace("-", "_")
    src = package_dir / "src" / module
    assert src.is_dir(), f"{package_dir.name}: missing src/{module}"
    declared = declared_distributions(package_dir / "pyproject.toml")
    problems = []
    for path in sorted(src.rglob("*.py")):
        imports = imported_top_level_modules(path.read_text())
        problems += [
            f"{path.relative_to(ROOT)}: {p}"
            for p in boundary_violations(package_dir.name, module, imports, declared)
        ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("package_dir", _packages(), ids=lambda p: p.name)
def test_test_imports_respect_what_the_package_declares(package_dir: Path):
    """A package's tests run in an environment with only what it declares (.ci/package-test)."""
    module = package_dir.name.replace("-", "_")
    tests = package_dir / "tests"
    assert tests.is_dir(), f"{package_dir.name}: missing tests/"
    declared = declared_test_distributions(package_dir)
    # A workspace package in a test group (rl-train's tests build their model with rl-rollout)
    # is allowed in the tests only.
    test_groups = {d.replace("-", "_") for d in group_distributions(package_dir / "pyproject.toml")}
    # the tests' own helper modules beside them (runtime_fakes.py ...: importable through the
    # root pytest `pythonpath`, which every package's alone run uses too)
    helpers = {p.stem for p in tests.glob("*.py") if not p.stem.startswith(("test_", "conftest"))}
    allowed = ALLOWED[package_dir.name] | (test_groups & WORKSPACE)
    problems = []
    for path in sorted(tests.rglob("*.py")):
        imports = imported_top_level_modules(path.read_text()) - helpers
        problems += [
            f"{path.relative_to(ROOT)}: {p}"
            for p in boundary_violations(package_dir.name, module, imports, declared, allowed)
        ]
    assert not problems, "\n".join(problems)


def test_test_checker_allows_dev_tools_and_test_groups_only(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "rl-algos"\ndependencies = ["torch>=2.4"]\n'
        '[dependency-groups]\ntest = ["rl-config"]\n'
    )
    declared = declared_test_distributions(tmp_path)
    assert {"torch", "rl-config", "pytest", "pytest-xdist"} <= declared
    assert "pyyaml" not in declared
    imports = imported_top_level_modules("import pytest, xdist, torch, rl_config, yaml\n")
    problems = boundary_violations(
        "rl-algos", "rl_algos", imports, declared, {"torch", "rl_config"}
    )
    assert problems == ["rl-algos imports yaml but declares none of ['pyyaml']"]


def test_workspace_test_groups_form_no_cycle():
    """A test group may name a sibling, never a package that depends on this one."""
    for package_dir in _packages():
        module = package_dir.name.replace("-", "_")
        for dep in group_distributions(package_dir / "pyproject.toml"):
            if dep in ALLOWED:
                assert module not in ALLOWED[dep], f"{package_dir.name} test group names {dep}"


def test_checker_catches_a_forbidden_and_an_undeclared_import():
    imports = imported_top_level_modules(
        "import torch\nfrom transformers import AutoModel\n"
        "def f():\n    import rl_train\n    import yaml\n"
    )
    problems = boundary_violations("rl-algos", "rl_algos", imports, {"torch"})
    assert any("imports transformers: forbidden" in p for p in problems)
    assert any("imports rl_train: forbidden" in p for p in problems)
    assert any("imports yaml but declares none" in p for p in problems)
    assert boundary_violations("rl-algos", "rl_algos", {"torch", "math"}, {"torch"}) == []


def test_workspace_dependencies_follow_the_rule():
    for package_dir in _packages():
        declared = declared_distributions(package_dir / "pyproject.toml")
        workspace_deps = {d.replace("-", "_") for d in declared if d.startswith("rl-")}
        forbidden = workspace_deps - ALLOWED[package_dir.name]
        assert not forbidden, f"{package_dir.name} depends on {sorted(forbidden)}"


def _new_modules_after(import_line: str, baseline: str = "") -> set[str]:
    code = (
        "import sys\n"
        f"{baseline}\n"
        "before = set(sys.modules)\n"
        f"{import_line}\n"
        "print('\\n'.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return set(out.split()) - set(sys.stdlib_module_names)


def test_import_rl_config_stays_light():
    new = _new_modules_after("import rl_config")
    assert not new & (HEAVY | {"numpy"}), sorted(new & (HEAVY | {"numpy"}))


def test_import_rl_algos_pulls_in_nothing_but_torch():
    # Whatever torch itself imports is allowed; rl_algos must add nothing beyond itself.
    extra = _new_modules_after("import rl_algos", baseline="import torch")
    assert extra <= {"rl_algos"}, sorted(extra)


def test_import_rl_envs_needs_only_numpy():
    new = _new_modules_after("import rl_envs")
    assert not new & (HEAVY | {"PIL", "pyarrow", "math_verify"}), sorted(new)
