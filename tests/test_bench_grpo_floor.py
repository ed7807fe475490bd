"""tools/bench/grpo_step.step_gflop and dpo_step.step_gflop: the matrix arithmetic of a GRPO
and of a DPO step, against hand counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench import dpo_step
from tools.bench.grpo_step import step_gflop


def tiny_config(path: Path) -> Path:
    """One layer, hidden 8, 2 heads of 4, 1 KV head, MLP 16, vocabulary 10, tied embeddings."""
    from transformers import Qwen2Config

    Qwen2Config(
        hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=10, tie_word_embeddings=True,
    ).save_pretrained(path)  # fmt: skip
    return path


def test_step_gflop_matches_a_hand_count(tmp_path: Path):
    tiny_config(tmp_path)
    linear = 8 * 8 + 8 * 4 + 8 * 4 + 8 * 8 + 3 * 8 * 16  # q k v o, gate up down = 576
    head = 10 * 8
    # prompts of 2 and 3 tokens, 2 samples each, 3 new tokens: the body runs each prompt once
    # and the first 2 sampled tokens of each of the 4 rows: 5 + 8 = 13 tokens
    fed = 5 + 4 * 2
    scored = 4 * 3
    # keys seen: prompt positions 1+2 and 1+2+3; sampled tokens at lengths 3, 4 (prompt 2) and
    # 4, 5 (prompt 3), twice each: 3 + 6 + 2 * (7 + 9) = 41
    keys = 3 + 6 + 2 * (3 + 4 + 4 + 5)
    forward = 2 * linear * fed + 4 * 1 * 8 * keys + 2 * head * scored
    generation, update = step_gflop(tmp_path, [2, 3], group=2, new_tokens=3)
    assert generation * 1e9 == pytest.approx(forward)
    assert update * 1e9 == pytest.approx(3 * forward)


def test_dpo_step_gflop_matches_a_hand_count_shared_and_not(tmp_path: Path):
    tiny_config(tmp_path)
    linear, head, width = 576, 10 * 8, 8  # as above
    # one pair, a 2-token prompt, 2-token responses. Unshared: 2 rows of 4 tokens, keys seen
    # 1+2+3+4 per row; logits at the 2 response positions of each row
    unshared = 2 * linear * 8 + 4 * width * 2 * 10 + 2 * head * 4
    # shared: the prompt's first token once (1 key), then each row's last prompt token and its
    # 2 response tokens (3 tokens, keys 2, 3, 4): 1 + 2 * 3 tokens, 1 + 2 * 9 keys
    shared = 2 * linear * 7 + 4 * width * 19 + 2 * head * 4
    assert dpo_step.step_gflop(str(tmp_path), 1, 2, 2, shared=False) * 1e9 == pytest.approx(
        3 * unshared
    )
    assert dpo_step.step_gflop(str(tmp_path), 1, 2, 2, shared=True) * 1e9 == pytest.approx(
        3 * shared
    )
