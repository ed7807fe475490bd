"""Supervised warm-up demonstrations: each training prompt with its ground-truth answer written
in the reward's format (`rlvr_app.warmup.response_template`), a fraction of them with a wrong
number on purpose (`answer_noise`) so that the warm-up imitates a noisy teacher and RL has to
learn to stop making those mistakes. An optional `{reasoning}` in the template is padding of a
long-tailed number of words (`reasoning_words`), so the policy learns a long-tailed response
length (tools/bench/async.py)."""

from __future__ import annotations

import random
from typing import Any

from rl_config.records import Trajectory


def noisy_answer(truth: Any, rng: random.Random, noise: float) -> str:
    """The answer as text; with probability `noise` a numeric answer is moved by 1..9."""
    text = str(truth)
    if rng.random() >= noise or not text.lstrip("-").isdigit():
        return text
    return str(int(text) + rng.choice([d for d in range(-9, 10) if d]))


def reasoning_words(rng: random.Random, max_words: int, tail: float) -> int:
    """A long-tailed word count in [0, max_words]: floor(U ** (-1 / tail)) - 1 for U uniform in
    (0, 1], i.e. P(k >= K) = (1 + K) ** -tail (a discrete Pareto), capped at max_words."""
    if max_words <= 0:
        return 0
    u = 1.0 - rng.random()  # (0, 1]
    return min(max_words, int(u ** (-1.0 / tail)) - 1)


def demonstrations(
    rows: list, prompt_ids: list[list[int]], tokenizer: Any, options: Any, seed: int
):
    """One `Trajectory` per row: prompt tokens (not trained on), then the response and eos."""
    rng = random.Random(seed)
    out = []
    for row, prompt in zip(rows[: options.demos], prompt_ids, strict=False):
        answer = noisy_answer(row.ground_truth, rng, options.answer_noise)
        words = reasoning_words(rng, options.reasoning_max_words, options.reasoning_tail)
        text = options.response_template.format(
            answer=answer, reasoning=options.reasoning_word * words
        )
        response = [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        p = len(prompt)
        out.append(Trajectory(
            traj_id=f"demo-{row.index}", group_id=f"demo-{row.index}", tag=row.data_source,
            env_seed=row.index, token_ids=[*prompt, *response], prompt_length=p,
            response_mask=[False] * p + [True] * len(response),
            rollout_log_probs=[0.0] * (p + len(response)),
        ))  # fmt: skip
    return out
