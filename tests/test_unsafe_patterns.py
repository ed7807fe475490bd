"""Unsafe patterns banned from the source tree (untrusted input: model output, data, checkpoints), on the AST.

Everywhere (sources, tests, tools, apps):
- ``torch.load`` without ``weights_only=True`` (a checkpoint or state file runs pickle);
- ``yaml.load``/``load_all`` without a safe loader, ``yaml.unsafe_load``/``full_load``;
- ``shell=True`` (or any value other than a literal False) in a call.
Outside tests:
- the bind-all addresses ``"0.0.0.0"``, ``"::"``, ``"[::]"`` (servers bind to loopback by default);
- ``trust_remote_code`` defaulting to True: a ``trust_remote_code=True`` argument, a parameter or
  field default, a ``.get("trust_remote_code", True)`` fallback, a dict entry, or
  ``trust_remote_code: true`` in a YAML config.
A line may waive its own finding with a comment ``# unsafe-pattern-ok: <reason>`` (or ruff's
``# noqa: S104`` for a bind-all literal, e.g. one compared against, never bound to).
Ruff's bandit rules (S104, S301, S506, S602, S604, S605) catch some of these at lint time; this
test also covers tests and the patterns ruff has no rule for.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIPPED_DIRS = {"build", "dist", "output", "runs", "__pycache__", "node_modules"}
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}
BIND_ALL = {"0.0.0.0", "::", "[::]"}
REMOTE_CODE = "trust_remote_code"


def _dotted(node: ast.expr) -> str:
    """``a.b.c`` for a Name/Attribute chain, else ``""``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _keyword(call: ast.Call, name: str) -> ast.keyword | None:
    return next((k for k in call.keywords if k.arg == name), None)


def _call_problems(call: ast.Call, in_tests: bool) -> list[str]:
    name = _dotted(call.func)
    problems = []
    if name == "torch.load":
        weights_only = _keyword(call, "weights_only")
        if weights_only is None or not _is_true(weights_only.value):
            problems.append("torch.load without weights_only=True")
    if name in {"yaml.load", "yaml.load_all"}:
        loader = _keyword(call, "Loader")
        loader_node = loader.value if loader else (call.args[1] if len(call.args) > 1 else None)
        loader_name = _dotted(loader_node).rsplit(".", 1)[-1] if loader_node else ""
        if loader_name not in SAFE_YAML_LOADERS:
            problems.append(f"{name} without a safe Loader (use yaml.safe_load)")
    if name in {"yaml.unsafe_load", "yaml.unsafe_load_all", "yaml.full_load", "yaml.full_load_all"}:
        problems.append(f"{name} (use yaml.safe_load)")
    shell = _keyword(call, "shell")
    if shell is not None and not (
        isinstance(shell.value, ast.Constant) and shell.value.value is False
    ):
        problems.append("shell=True (pass an argument list)")
    if not in_tests:
        remote = _keyword(call, REMOTE_CODE)
        if remote is not None and _is_true(remote.value):
            problems.append(f"{REMOTE_CODE}=True")
        if (
            isinstance(call.func, ast.Attribute)
            and call.func.attr == "get"
            and len(call.args) == 2
            and isinstance(call.args[0], ast.Constant)
            and call.args[0].value == REMOTE_CODE
            and _is_true(call.args[1])
        ):
            problems.append(f'.get("{REMOTE_CODE}", True): the default must be False')
    return problems


def _remote_code_default_problems(node: ast.AST) -> list[str]:
    """``trust_remote_code`` defaulting to True in a signature, a class field or a dict."""
    problems = []
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        args = node.args
        positional = args.posonlyargs + args.args
        pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        if any(a.arg == REMOTE_CODE and _is_true(d) for a, d in pairs):
            problems.append(f"parameter {REMOTE_CODE} defaults to True")
    elif isinstance(node, ast.AnnAssign) and _dotted(node.target).endswith(REMOTE_CODE):
        value = node.value
        if isinstance(value, ast.Call):  # Field(default=True) / Field(True)
            default = _keyword(value, "default")
            value = default.value if default else (value.args[0] if value.args else None)
        if _is_true(value):
            problems.append(f"field {REMOTE_CODE} defaults to True")
    elif isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values):
            if isinstance(key, ast.Constant) and key.value == REMOTE_CODE and _is_true(value):
                problems.append(f'"{REMOTE_CODE}": True in a dict')
    return problems


WAIVER = re.compile(r"#.*unsafe-pattern-ok:\s*\S")


def unsafe_patterns(source: str, *, in_tests: bool = False) -> list[str]:
    """``"line N: what"`` for each banned pattern in Python ``source`` (waived lines left out)."""
    lines = source.splitlines()
    problems = []
    for node in ast.walk(ast.parse(source)):
        found = []
        if isinstance(node, ast.Call):
            found += _call_problems(node, in_tests)
        if not in_tests:
            found += _remote_code_default_problems(node)
            if isinstance(node, ast.Constant) and node.value in BIND_ALL:
                line = lines[node.lineno - 1]
                if "noqa: S104" not in line:
                    found.append(f"binds all interfaces ({node.value!r}): use 127.0.0.1")
        lineno: int = getattr(node, "lineno", 0)  # every node that yields a finding has one
        if found and WAIVER.search(lines[lineno - 1]):
            continue
        problems += [f"line {lineno}: {p}" for p in found]
    return problems


def unsafe_yaml_config(text: str) -> list[str]:
    return [
        f"line {n}: {REMOTE_CODE}: true in a config"
        for n, line in enumerate(text.splitlines(), 1)
        if re.match(rf"\s*{REMOTE_CODE}\s*:\s*(true|True|TRUE|yes|on)\s*(#.*)?$", line)
    ]


def _is_test_path(path: Path) -> bool:
    parts = path.relative_to(ROOT).parts
    return "tests" in parts or path.name == "conftest.py"


def _source_files(suffixes: tuple[str, ...]) -> list[Path]:
    found = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT).parts
        if any(p.startswith(".") or p in SKIPPED_DIRS for p in rel[:-1]):
            continue
        if path.suffix in suffixes and path.is_file():
            found.append(path)
    return sorted(found)


def test_the_tree_has_no_unsafe_python_pattern():
    files = _source_files((".py",))
    assert len(files) > 100, f"scanned only {len(files)} files under {ROOT}"
    problems = [
        f"{path.relative_to(ROOT)}:{p}"
        for path in files
        if path != Path(__file__)
        for p in unsafe_patterns(path.read_text(), in_tests=_is_test_path(path))
    ]
    assert not problems, "\n".join(problems)


def test_no_config_enables_remote_code():
    files = [p for p in _source_files((".yaml", ".yml")) if not _is_test_path(p)]
    problems = [
        f"{path.relative_to(ROOT)}:{p}"
        for path in files
        for p in unsafe_yaml_config(path.read_text())
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("torch.load(p)", "torch.load without weights_only=True"),
        ("torch.load(p, weights_only=False)", "torch.load without weights_only=True"),
        ("torch.load(p, weights_only=flag)", "torch.load without weights_only=True"),
        ("yaml.load(text)", "yaml.load without a safe Loader"),
        ("yaml.load(text, Loader=yaml.Loader)", "yaml.load without a safe Loader"),
        ("yaml.load(text, yaml.UnsafeLoader)", "yaml.load without a safe Loader"),
        ("yaml.load_all(text, Loader=yaml.FullLoader)", "yaml.load_all without a safe Loader"),
        ("yaml.unsafe_load(text)", "yaml.unsafe_load"),
        ("yaml.full_load(text)", "yaml.full_load"),
        ("subprocess.run(cmd, shell=True)", "shell=True"),
        ("subprocess.Popen(cmd, shell=use_shell)", "shell=True"),
        ("asyncio.create_subprocess_exec(cmd, shell=True)", "shell=True"),
        ("server.bind(('0.0.0.0', port))", "binds all interfaces ('0.0.0.0')"),
        ("HOST = '::'", "binds all interfaces ('::')"),
        ("ray.init(_node_ip_address='[::]')", "binds all interfaces ('[::]')"),
        ("AutoModel.from_pretrained(p, trust_remote_code=True)", "trust_remote_code=True"),
        (
            "def load(p, trust_remote_code=True): ...",
            "parameter trust_remote_code defaults to True",
        ),
        ("def load(p, *, trust_remote_code=True): ...", "parameter trust_remote_code defaults"),
        (
            "class C:\n    trust_remote_code: bool = True",
            "field trust_remote_code defaults to True",
        ),
        (
            "class C:\n    trust_remote_code: bool = Field(default=True, description='x')",
            "field trust_remote_code defaults to True",
        ),
        ("kwargs = {'trust_remote_code': True}", '"trust_remote_code": True in a dict'),
        ("cfg.get('trust_remote_code', True)", '.get("trust_remote_code", True)'),
    ],
)
def test_checker_catches(source, expected):
    problems = unsafe_patterns(source)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    "source",
    [
        "torch.load(p, weights_only=True)",
        "torch.load(p, map_location='cpu', weights_only=True)",
        "yaml.safe_load(text)",
        "yaml.load(text, Loader=yaml.SafeLoader)",
        "yaml.load(text, yaml.CSafeLoader)",
        "subprocess.run(['ls'], shell=False)",
        "subprocess.run(['ls'])",
        "HOST = '127.0.0.1'",
        "AutoModel.from_pretrained(p, trust_remote_code=False)",
        "AutoModel.from_pretrained(p, trust_remote_code=cfg.trust_remote_code)",
        "def load(p, trust_remote_code=False): ...",
        "class C:\n    trust_remote_code: bool = Field(default=False)",
        "cfg.get('trust_remote_code', False)",
        "loader.load(p)",  # not torch's
    ],
)
def test_checker_allows(source):
    assert unsafe_patterns(source) == []


def test_tests_may_name_bind_all_addresses_and_remote_code_but_not_run_pickle():
    source = (
        "assert addr != '0.0.0.0'\n"
        "engine = build(trust_remote_code=True)\n"
        "torch.load(path)\n"
        "subprocess.run(cmd, shell=True)\n"
    )
    assert unsafe_patterns(source, in_tests=True) == [
        "line 3: torch.load without weights_only=True",
        "line 4: shell=True (pass an argument list)",
    ]


def test_a_line_can_waive_its_finding_with_a_reason():
    assert unsafe_patterns("torch.load(p)  # unsafe-pattern-ok: our own file, see docs") == []
    assert unsafe_patterns("if host in ('0.0.0.0', '::'):  # noqa: S104\n    pass") == []
    assert unsafe_patterns("torch.load(p)  # unsafe-pattern-ok:") != []  # a reason is required
    assert unsafe_patterns("torch.load(p)  # noqa: S104") != []  # S104 waives bind-all only


def test_yaml_config_check():
    assert unsafe_yaml_config("model:\n  trust_remote_code: true  # why\n") == [
        "line 2: trust_remote_code: true in a config"
    ]
    assert unsafe_yaml_config("trust_remote_code: false\n# trust_remote_code: true\n") == []
