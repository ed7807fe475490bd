"""Prompt templates in the style of ROLL's agentic templates.

A turn prompt is filled with ``{turn_idx}``, ``{observation}``, ``{actions_left}`` and
``{max_response_length}``; unknown fields are an error naming the field.
"""

from __future__ import annotations

import string
from typing import Any

TURN_FIELDS = ("turn_idx", "observation", "actions_left", "max_response_length")

DEFAULT_SYSTEM_PROMPT = (
    "You're a helpful assistant. You are a good game player. You are aiming to get high reward in "
    "the game."
)

ANSWER_TURN_TEMPLATE = (
    "Turn {turn_idx}:\nState:\n{observation}\nYou have {actions_left} actions left. "
    "Always output: <answer> [your answer] </answer> with no extra text. Strictly follow this "
    "format. Max response length: {max_response_length} words (tokens).\nDecide the next action:\n"
)

THINK_TURN_TEMPLATE = (
    "Turn {turn_idx}:\nState:\n{observation}\nYou have {actions_left} actions left. "
    "Always output: <think> [Your thoughts] </think> <answer> [your answer] </answer> with no "
    "extra text. Strictly follow this format. Max response length: {max_response_length} words "
    "(tokens).\nDecide the next action:\n"
)


def template_fields(template: str) -> set[str]:
    """The ``{field}`` names a template uses."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def validate_template(template: str, allowed: tuple[str, ...] = TURN_FIELDS) -> None:
    """Raise ``ValueError`` naming any field the template uses that is not in ``allowed``."""
    unknown = sorted(template_fields(template) - set(allowed))
    if unknown:
        raise ValueError(f"prompt template uses unknown field(s) {unknown}; allowed: {allowed}")


def format_turn(
    template: str,
    *,
    turn_idx: int,
    observation: str,
    actions_left: int,
    max_response_length: int,
    **extra: Any,
) -> str:
    """Fill a turn template. ``extra`` fields are allowed only if the caller passes them."""
    validate_template(template, (*TURN_FIELDS, *extra.keys()))
    return template.format(
        turn_idx=turn_idx,
        observation=observation,
        actions_left=actions_left,
        max_response_length=max_response_length,
        **extra,
    )
