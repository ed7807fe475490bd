"""Turning a model's free-text response into environment actions.

A response is matched against a regular expression (``action_pattern``); the LAST capture group
holds the answer. ``<answer>(.*?)</answer>`` accepts a bare answer, ``THINK_ANSWER_PATTERN`` also
demands a ``<think>`` block first. Answers are looked up case-insensitively in the env's action
names; several actions in one answer are separated by ``action_sep`` (``"||"``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ANSWER_PATTERN = r"<answer>(.*?)</answer>"
THINK_ANSWER_PATTERN = r"<think>(.*?)</think>\s*<answer>(.*?)</answer>"
PATTERNS = {"answer": ANSWER_PATTERN, "think_answer": THINK_ANSWER_PATTERN}


@dataclass(frozen=True)
class ParsedAction:
    """Result of parsing one response.

    ``format_ok``: the pattern matched. ``action_is_valid``: format ok and every answered action is
    one of the env's actions. ``actions``: the recognised action names, in order.
    """

    format_ok: bool
    action_is_valid: bool
    answer_text: str | None
    actions: tuple[str, ...] = field(default_factory=tuple)
    thinking: str | None = None


#: a response longer than this is a format error (never searched): the named patterns are
#: parsed in linear time, a custom regular expression may not be
MAX_RESPONSE_CHARS = 1 << 20
_ANSWER_AFTER_THINK = re.compile(r"\s*<answer>")


def has_answer_tag(response: str) -> bool:
    """``<answer>...</answer>`` is in the response (linear, bounded like `parse_action`)."""
    return len(response) <= MAX_RESPONSE_CHARS and _named_match(response, "answer") is not None


def _named_match(text: str, name: str) -> tuple[str | None, str] | None:
    """``(thinking, answer)`` as ``re.search`` of the named pattern would capture them, found
    with ``str.find`` in linear time (a lazy ``.*?`` search rescans the text from every
    ``<answer>`` that is never closed: quadratic)."""
    if name == "answer":
        start = text.find("<answer>")
        end = text.find("</answer>", start + 8) if start >= 0 else -1
        return None if end < 0 else (None, text[start + 8 : end])
    start = text.find("<think>")
    last_close = text.rfind("</answer>")
    if start < 0 or last_close < 0:
        return None
    close = text.find("</think>", start + 7)
    while close >= 0:
        after = _ANSWER_AFTER_THINK.match(text, close + 8)
        if after is not None and last_close >= after.end():
            return text[start + 7 : close], text[after.end() : text.find("</answer>", after.end())]
        close = text.find("</think>", close + 8)
    return None


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """Compile ``pattern`` (or a named one from ``PATTERNS``) with DOTALL semantics."""
    source = PATTERNS.get(pattern, pattern)
    compiled = re.compile(source, re.DOTALL)
    if compiled.groups < 1:
        raise ValueError(f"action_pattern {pattern!r} needs at least one capture group")
    return compiled


def parse_action(
    response: str,
    pattern: re.Pattern[str],
    action_names: list[str] | tuple[str, ...],
    *,
    action_sep: str = "||",
    max_actions: int = 1,
) -> ParsedAction:
    """Parse ``response``; never raises on bad model output. One longer than
    `MAX_RESPONSE_CHARS` is a format error."""
    named = next((n for n, source in PATTERNS.items() if pattern.pattern == source), None)
    if len(response) > MAX_RESPONSE_CHARS:
        found = None
    elif named is not None and pattern.flags & re.DOTALL:
        found = _named_match(response, named)
    else:
        match = pattern.search(response)
        found = None
        if match is not None:
            thinking = match.group(1) if pattern.groups >= 2 else None
            found = (thinking, match.group(pattern.groups) or "")
    if found is None:
        return ParsedAction(format_ok=False, action_is_valid=False, answer_text=None)
    thinking, answer = found
    by_lower = {name.lower(): name for name in action_names}
    parts = [p.strip() for p in answer.split(action_sep)] if action_sep else [answer.strip()]
    parts = [p for p in parts if p]
    actions = tuple(by_lower[p.lower()] for p in parts if p.lower() in by_lower)
    valid = bool(parts) and len(actions) == len(parts) and len(actions) <= max_actions
    return ParsedAction(
        format_ok=True,
        action_is_valid=valid,
        answer_text=answer.strip(),
        actions=actions if valid else (),
        thinking=thinking,
    )
