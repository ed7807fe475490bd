"""User reward functions loaded from a file path and a function name (verl's
``custom_reward_function.{path,name}``).

Offers: ``load_custom_reward(path, function_name, style="auto") -> CustomReward``. Two
signatures: verl's ``(data_source, solution_str, ground_truth, extra_info)`` called per
response, and TRL's ``(prompts, completions, **columns)`` called once per batch and returning a
list. Either may be ``async def`` (awaited in the sandbox worker) and return a float or a dict
with ``score`` (other entries become metrics). The file is read and checked WITHOUT running it
(``ast``); it only ever runs inside the sandbox.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from typing import Literal

VERL_PARAMS = ("data_source", "solution_str", "ground_truth", "extra_info")
TRL_PARAMS = ("prompts", "completions")
Style = Literal["verl", "trl"]


@dataclass(frozen=True)
class CustomReward:
    """Source text and function name of a user reward file. ``style``: ``verl`` (per
    response) or ``trl`` (per batch); ``is_async``: an ``async def``."""

    path: str
    function: str
    source: str
    style: Style = "verl"
    is_async: bool = False


def _style(fn: ast.FunctionDef | ast.AsyncFunctionDef, where: str, want: str) -> Style:
    positional = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    named = {*positional, *(a.arg for a in fn.args.kwonlyargs)}
    open_ended = fn.args.kwarg is not None or fn.args.vararg is not None
    if want == "auto":
        want = "trl" if "completions" in named and "solution_str" not in named else "verl"
    if want == "trl":
        if "completions" not in named and not open_ended:
            raise ValueError(f"{where} must accept (prompts, completions, **columns) (TRL style)")
        return "trl"
    if want != "verl":
        raise ValueError(f"unknown reward function style {want!r} (use auto, verl or trl)")
    missing = [p for p in VERL_PARAMS if p not in named]
    if missing and not open_ended:
        raise ValueError(
            f"{where} must accept (data_source, solution_str, ground_truth, extra_info) (verl "
            f"style) or (prompts, completions, **columns) (TRL style); missing {missing}"
        )
    return "verl"


def load_custom_reward(
    path: str, function_name: str = "compute_score", style: str = "auto"
) -> CustomReward:
    """Read ``path`` and check that it defines ``function_name`` with verl's or TRL's
    signature (``style``: auto, verl or trl; auto picks TRL when the function takes
    ``completions`` and no ``solution_str``)."""
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
    return CustomReward(
        path=os.path.abspath(path),
        function=function_name,
        source=source,
        style=_style(fn, f"{path}:{function_name}", style),
        is_async=isinstance(fn, ast.AsyncFunctionDef),
    )
