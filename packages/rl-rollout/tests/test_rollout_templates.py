"""Named chat templates render the exact text of their model family (pinned strings)."""

import pytest

from rl_rollout.templates import get_template, list_templates

TWO_TURNS = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 2+3?"},
    {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n5"},
    {"role": "user", "content": "And 2*3?"},
]


def test_qwen3_two_turns_drops_earlier_reasoning_and_has_no_default_system():
    text = get_template("qwen3", None).prefix(TWO_TURNS)
    assert text == (
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        "<|im_start|>assistant\n5<|im_end|>\n"
        "<|im_start|>user\nAnd 2*3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_system = get_template("qwen3", None).prefix(TWO_TURNS[1:2])
    assert no_system == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"


def test_qwen3_keeps_reasoning_after_the_last_user_message():
    """An assistant message after the last user message keeps its thinking block (empty when it
    has none and is the last message), as Qwen3's own template renders it."""
    t = get_template("qwen3", None)
    kept = t.prefix([*TWO_TURNS[:2], {"role": "assistant", "content": "<think>add</think>5"}])
    assert kept.endswith(
        "<|im_start|>assistant\n<think>\nadd\n</think>\n\n5<|im_end|>\n<|im_start|>assistant\n"
    )
    plain = t.prefix([TWO_TURNS[1], {"role": "assistant", "content": "5"}])
    assert plain.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n5<|im_end|>\n"
                          "<|im_start|>assistant\n")  # fmt: skip
    via_field = t.prefix([TWO_TURNS[1], {"role": "assistant", "content": "5",
                                         "reasoning_content": "r"}])  # fmt: skip
    assert "<think>\nr\n</think>\n\n5<|im_end|>" in via_field


def test_qwen3_turn_suffix_and_thinking_off():
    t = get_template("qwen3", None)
    assert t.turn_suffix("6?", model_closed_turn=False) == (
        "<|im_end|>\n<|im_start|>user\n6?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert t.turn_suffix("6?", model_closed_turn=True).startswith("\n<|im_start|>user\n")
    off = get_template("qwen3_nothink", None)
    assert off.prefix(TWO_TURNS).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert off.turn_suffix("x", model_closed_turn=True).endswith("<think>\n\n</think>\n\n")


@pytest.mark.parametrize("messages", [TWO_TURNS, TWO_TURNS[1:2]])
def test_qwen2_vl_renders_text_as_qwen2_5(messages):
    vl, q25 = get_template("qwen2-vl", None), get_template("qwen2_5", None)
    assert vl.prefix(messages) == q25.prefix(messages)
    assert vl.turn_suffix("o", model_closed_turn=False) == q25.turn_suffix(
        "o", model_closed_turn=False
    )
    assert vl.prefix(TWO_TURNS[1:2]).startswith(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    )


def test_registry_lists_roll_template_names():
    assert {"native", "qwen2_5", "qwen2-vl", "qwen3"} <= set(list_templates())
