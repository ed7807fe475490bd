"""Supervised warm-up demonstrations: each training prompt with its ground-truth answer written
in the reward's format (`rlvr_app.warmup.response_template`), a fraction of them with a wrong
number on purpose (`answer_noise`) so that the warm-up imitates a noisy teacher and RL has to
learn to stop making those mistakes. An optional `{reasoning}` in the template is padding of a
long-tailed number of words (`reasoning_words`), so the policy learns a long-tailed response
length (tools/bench/async.py)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from rl_config.records import Trajectory

ANSWER_ERRORS = ("shift", "carry")
"""The noisy teacher's mistakes (`WarmupOptions.answer_error`)."""


@dataclass
class WarmupOptions:
    """Supervised warm-up on training answers before RL (`rlvr_app.warmup`; 0 steps = off); it
    uses actor_train's optimizer, at `learning_rate` when set."""

    steps: int = 0
    batch_size: int = 32
    #: training rows used as demonstrations at most
    demos: int = 1024
    learning_rate: float | None = None
    #: the demonstrated response; `{answer}` is the row's ground truth, `{reasoning}` (optional)
    #: the reasoning padding below
    response_template: str = "#### {answer}"
    #: probability that a demonstrated numeric answer is wrong on purpose (a noisy teacher)
    answer_noise: float = 0.0
    #: the teacher's mistake (`ANSWER_ERRORS`): `shift` moves the answer by 1..9; `carry` writes
    #: an `a+b=` sum without carrying (rl_envs.tasks.arith.sum_without_carry; a sum with no
    #: carry, and any other question, is demonstrated right)
    answer_error: str = "shift"
    #: `{reasoning}` is `reasoning_word` repeated k times, k long-tailed (`reasoning_words`, shape
    #: `reasoning_tail`), capped at `reasoning_max_words`; 0 = no padding. Teaches the policy a
    #: long-tailed response length.
    reasoning_max_words: int = 0
    reasoning_tail: float = 1.0
    reasoning_word: str = " then"  # one token of the tiny model's tokenizer

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "demos"):
            least = 0 if name == "steps" else 1
            if getattr(self, name) < least:
                raise ValueError(
                    f"rlvr_app.warmup.{name}={getattr(self, name)}: must be >= {least}"
                )
        if not 0 <= self.answer_noise <= 1:
            raise ValueError(
                f"rlvr_app.warmup.answer_noise={self.answer_noise}: a probability in [0, 1]"
            )
        if self.answer_error not in ANSWER_ERRORS:
            raise ValueError(
                f"rlvr_app.warmup.answer_error={self.answer_error!r}: one of {ANSWER_ERRORS}"
            )
        if self.learning_rate is not None and self.learning_rate <= 0:
            raise ValueError(f"rlvr_app.warmup.learning_rate={self.learning_rate}: must be > 0")
        if self.reasoning_max_words < 0:
            raise ValueError(
                f"rlvr_app.warmup.reasoning_max_words={self.reasoning_max_words}: must be >= 0"
            )
        if self.reasoning_tail <= 0:
            raise ValueError(f"rlvr_app.warmup.reasoning_tail={self.reasoning_tail}: must be > 0")


def noisy_answer(
    truth: Any, rng: random.Random, noise: float, error: str = "shift", question: str = ""
) -> str:
    """The answer as text; with probability `noise` a mistake: `shift` moves a numeric answer by
    1..9, `carry` gives the forgotten-carry sum of an `a+b=` `question` (when it has one)."""
    from rl_envs.tasks.arith import carry_mistake

    text = str(truth)
    if rng.random() >= noise:
        return text
    if error == "carry":
        return carry_mistake(question) or text
    if not text.lstrip("-").isdigit():
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
    rows: list, prompt_ids: list[list[int]], tokenizer: Any, options: WarmupOptions, seed: int
) -> list[Trajectory]:
    """One `Trajectory` per row: prompt tokens (not trained on), then the response and eos."""
    rng = random.Random(seed)
    out = []
    for row, prompt in zip(rows[: options.demos], prompt_ids, strict=False):
        answer = noisy_answer(row.ground_truth, rng, options.answer_noise,
                              options.answer_error, row.question)  # fmt: skip
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


def warm_up(
    ctx: Any, train: Any, tokenizer: Any, options: WarmupOptions, pad_token_id: int
) -> dict[str, float]:
    """apps/rlvr's supervised warm-up (none at `options.steps <= 0`): `demonstrations` of the
    training prompts `train` (an rl_runtime.pipelines.rlvr.data.PromptSet) as SFT rows
    (rl_runtime.step.sft_data), then rl_runtime.step.sft_warmup.supervised_warmup (which also
    syncs the weights)."""
    from rl_runtime.step.sft_data import examples_from_trajectories
    from rl_runtime.step.sft_warmup import supervised_warmup

    if options.steps <= 0:
        return {}
    demos = demonstrations(train.rows, train.ids, tokenizer, options, ctx.components.seed)
    return supervised_warmup(ctx, examples_from_trajectories(demos), steps=options.steps, batch_size=options.batch_size,
                             learning_rate=options.learning_rate, log_every=10,
                             pad_token_id=pad_token_id)  # fmt: skip
