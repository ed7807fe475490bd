"""verl-style custom reward functions loaded from a file path and a function name.

The file is read and checked WITHOUT running it (``ast``); it only ever runs inside the sandbox.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

VERL_PARAMS = ("data_source", "solution_str", "ground_truth", "extra_info")


@dataclass(frozen=True)
class CustomReward:
    """Source text and function name of a user reward file."""

    path: str
    function: str
    source: str


def load_custom_reward(path: str, function_name: str = "compute_score") -> CustomReward:
    """Read ``path`` and check that it defines ``function_name`` accepting verl's four arguments."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"custom reward file not found: {path}")
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise ValueError(
            f"custom reward file {path}: syntax error at line {exc.lineno}: {exc.msg}"
        ) from exc
    functions = {
        n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    if function_name not in functions:
        raise ValueError(
            f"custom reward file {path} defines no top-level function {function_name!r}"
        )
    fn = functions[function_name]
    if isinstance(fn, ast.AsyncFunctionDef):
        raise ValueError(f"{path}:{function_name} must be a plain function, not async")
    positional = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    keywords = {*positional, *(a.arg for a in fn.args.kwonlyargs)}
    missing = [p for p in VERL_PARAMS if p not in keywords and fn.args.kwarg is None]
    if missing and fn.args.vararg is None:
        raise ValueError(
            f"{path}:{function_name} must accept (data_source, solution_str, ground_truth, "
            f"extra_info); missing {missing}"
        )
    return CustomReward(path=os.path.abspath(path), function=function_name, source=source)
