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
    """Parse ``response``; never raises on bad model output."""
    match = pattern.search(response)
    if match is None:
        return ParsedAction(format_ok=False, action_is_valid=False, answer_text=None)
    answer = match.group(pattern.groups) or ""
    thinking = match.group(1) if pattern.groups >= 2 else None
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
