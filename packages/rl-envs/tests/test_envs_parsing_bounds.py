"""Model output parsed in the trainer's process (outside the sandbox) costs linear time and has
a length bound: hostile text cannot hold the GIL for seconds."""

from __future__ import annotations

import random
import time

import pytest

from rl_envs.parsing import MAX_RESPONSE_CHARS, PATTERNS, compile_pattern, parse_action
from rl_envs.rewards.extraction import MAX_PARSE_CHARS, all_boxed, extract_boxed
from rl_envs.tasks.single_turn import SingleTurnEnv


def _timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


@pytest.mark.parametrize("text", ["\\boxed{" * 40_000, "\\boxed " * 40_000 + "{"],
                         ids=["unclosed", "bare"])  # fmt: skip
def test_boxed_is_linear(text):
    """280 KB of unclosed boxes: quadratic before (28 KB took 4.5 s)."""
    _, seconds = _timed(extract_boxed, text)
    assert seconds < 0.5


def test_boxed_answers_are_unchanged():
    text = r"a \boxed{\frac{1}{2}} b \boxed 5 c \fbox{x{y}} \boxed{\{z\}} \boxed{open"
    assert all_boxed(text) == [r"\frac{1}{2}", "5", "x{y}", r"\{z\}"]
    assert extract_boxed(r"\boxed{a\boxed{b}}") == r"a\boxed{b}"
    assert extract_boxed("\\boxed{1}" + " " * MAX_PARSE_CHARS) is None  # past the bound


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_named_action_patterns_are_linear_and_match_the_regex(name):
    pattern = compile_pattern(name)
    hostile = ("<think>x</think> <answer>" if name == "think_answer" else "<answer>") * 30_000
    result, seconds = _timed(parse_action, hostile, pattern, ["Up"])
    assert seconds < 0.5 and not result.format_ok
    rng = random.Random(0)
    pieces = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "Up", "x", "||"]
    for _ in range(3000):  # the same captures as re.search of the pattern
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        got = parse_action(text, pattern, ["Up"], max_actions=2)
        match = pattern.search(text)
        assert got.format_ok == (match is not None), text
        if match is not None:
            assert got.answer_text == match.group(pattern.groups).strip(), text
            assert got.thinking == (match.group(1) if pattern.groups >= 2 else None), text
    too_long = "<answer>Up</answer>" + " " * MAX_RESPONSE_CHARS
    assert not parse_action(too_long, pattern if name == "answer" else compile_pattern("answer"),
                            ["Up"]).format_ok  # fmt: skip


def test_single_turn_format_check_is_linear():
    env = SingleTurnEnv.__new__(SingleTurnEnv)
    _, seconds = _timed(env._format_ok, "<answer>" * 100_000 + "\\boxed{" * 40_000)
    assert seconds < 0.5
