"""Safe parsing of device lists such as ``list(range(0,2))`` (ROLL's ``device_mapping`` syntax).

ROLL evaluates the string with ``eval``; here a tiny grammar is parsed by hand, so nothing a config
says is ever executed. Accepted forms (whitespace is free, terms may be joined with ``+``)::

    list(range(4))   list(range(0, 8))   list(range(0, 8, 2))   range(0, 2)
    [0, 1, 2]        3                   list(range(0,2)) + [6, 7]
"""

from __future__ import annotations

import re

_MAX_LEN = 4096
_MAX_DEVICES = 1 << 16
_TOKEN = re.compile(r"\s*(?:(?P<int>-?\d+)|(?P<name>[A-Za-z_]+)|(?P<sym>[\[\](),+]))")


class DeviceListSyntaxError(ValueError):
    """The text is not one of the accepted device-list forms."""


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise DeviceListSyntaxError(f"unexpected character {text[pos:].strip()[:1]!r}")
        tokens.append(match.group(match.lastgroup or "sym"))
        pos = match.end()
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def expect(self, token: str) -> None:
        got = self.peek()
        if got != token:
            raise DeviceListSyntaxError(f"expected {token!r}, got {got!r}")
        self.pos += 1

    def integer(self) -> int:
        got = self.peek()
        if got is None or not re.fullmatch(r"-?\d+", got):
            raise DeviceListSyntaxError(f"expected an integer, got {got!r}")
        self.pos += 1
        return int(got)

    def expression(self) -> list[int]:
        out = self.term()
        while self.peek() == "+":
            self.pos += 1
            out = out + self.term()
        return out

    def term(self) -> list[int]:
        got = self.peek()
        if got == "[":
            return self.bracket_list()
        if got == "list":
            self.pos += 1
            self.expect("(")
            inner = self.bracket_list() if self.peek() == "[" else self.range_call()
            self.expect(")")
            return inner
        if got == "range":
            return self.range_call()
        if got is not None and re.fullmatch(r"-?\d+", got):
            return [self.integer()]
        raise DeviceListSyntaxError(
            f"unexpected {got!r}; only list(range(a, b[, step])), range(...), [i, j, ...] and "
            "integers are allowed"
        )

    def bracket_list(self) -> list[int]:
        self.expect("[")
        items: list[int] = []
        while self.peek() != "]":
            items.append(self.integer())
            if self.peek() == ",":
                self.pos += 1
            elif self.peek() != "]":
                raise DeviceListSyntaxError(f"expected ',' or ']', got {self.peek()!r}")
        self.expect("]")
        return items

    def range_call(self) -> list[int]:
        self.expect("range")
        self.expect("(")
        args = [self.integer()]
        while self.peek() == ",":
            self.pos += 1
            args.append(self.integer())
        self.expect(")")
        if len(args) > 3:
            raise DeviceListSyntaxError("range() takes at most 3 arguments")
        if len(args) == 3 and args[2] == 0:
            raise DeviceListSyntaxError("range() step must not be zero")
        span = range(*args)
        if len(span) > _MAX_DEVICES:
            raise DeviceListSyntaxError(f"range() yields {len(span)} devices, too many")
        return list(span)


def parse_device_list(value: str | int | list[int] | tuple[int, ...]) -> list[int]:
    """Device ids from ROLL's ``device_mapping`` syntax, without ``eval``.

    >>> parse_device_list("list(range(0,2))")
    [0, 1]
    >>> parse_device_list("list(range(0, 8, 2)) + [9]")
    [0, 2, 4, 6, 9]

    Raises ``DeviceListSyntaxError`` (a ``ValueError``) for anything else, e.g.
    ``__import__('os')``.
    """
    if isinstance(value, bool):
        raise DeviceListSyntaxError("expected a device list, got a boolean")
    if isinstance(value, int):
        return [value]
    if isinstance(value, list | tuple):
        out: list[int] = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int):
                raise DeviceListSyntaxError(f"device ids must be integers, got {item!r}")
            out.append(item)
        return out
    if not isinstance(value, str):
        raise DeviceListSyntaxError(f"expected a device list, got {type(value).__name__}")
    if len(value) > _MAX_LEN:
        raise DeviceListSyntaxError(f"device list text is longer than {_MAX_LEN} characters")
    tokens = _tokenize(value)
    if not tokens:
        raise DeviceListSyntaxError("empty device list text")
    parser = _Parser(tokens)
    result = parser.expression()
    if parser.peek() is not None:
        raise DeviceListSyntaxError(f"unexpected {parser.peek()!r} after the device list")
    return result
