"""A safe arithmetic evaluator over Python's ``ast`` (never ``eval``).

Accepts numbers, ``+ - * / // % **``, unary signs and parentheses. Exponents and magnitudes are
bounded so that no input can take long or use much memory.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e100

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


class ArithmeticError_(ValueError):
    """The expression is not plain arithmetic, or is out of bounds."""


def _check(value: Any) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise ArithmeticError_("result is not finite")
    if abs(value) > MAX_MAGNITUDE:
        raise ArithmeticError_("result is too large")
    return value


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ArithmeticError_(f"exponent {right} exceeds {MAX_EXPONENT}")
        try:
            return _check(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError as exc:
            raise ArithmeticError_("division by zero") from exc
        except OverflowError as exc:
            raise ArithmeticError_("overflow") from exc
    raise ArithmeticError_(f"unsupported syntax: {type(node).__name__}")


def evaluate(expression: str) -> int | float:
    """Value of an arithmetic expression; ``ArithmeticError_`` (a ValueError) otherwise."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ArithmeticError_(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip().replace("^", "**"), mode="eval")
    except SyntaxError as exc:
        raise ArithmeticError_(f"not an expression: {exc.msg}") from exc
    return _eval(tree)


def numbers_in(expression: str) -> list[int | float]:
    """The numeric literals of an expression, in order (for Countdown's use-each-once rule)."""
    tree = ast.parse(expression.strip().replace("^", "**"), mode="eval")
    values: list[int | float] = []
    for node in ast.walk(tree):
        value = node.value if isinstance(node, ast.Constant) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            values.append(value)
    return values
