"""Rule rewards of the RLVR domains, in verl's signature, run INSIDE the sandbox.

Offers: ``math_rule_score`` (math: ``\\boxed{}``, else ``####``/``Answer:``, judged by
math-verify when installed, else the string/number grader) and ``format_score`` (1.0 when the
response matches a regex, e.g. ROLL's ``format_pattern``; a regex on model output can backtrack
for ever, hence the sandbox timeout) and ``crossthinkqa_score`` (ROLL's multiple-choice rule).
Targets: ``rl_envs.rewards.rules:<name>``.
"""

from __future__ import annotations

import re
from typing import Any

from rl_envs.rewards.extraction import (
    all_boxed,
    all_hash_answers,
    extract_hash_answer,
    single_answer,
)
from rl_envs.rewards.graders import GSM8K_SOURCES, gsm8k_score, math_equivalent, math_score

_ANSWER_LINE = re.compile(r"Answer\s*:\s*([^\n]+)")


def math_rule_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """1.0 if the final answer equals the ground truth, else 0.0. The answer is the boxed one;
    without a box, the ``####`` or ``Answer:`` line (GSM8K sources: verl's strict ``####``
    rule). Disagreeing answers name no answer (canary rules of ``rl_envs.rewards.graders``)."""
    if data_source in GSM8K_SOURCES and not all_boxed(solution_str):
        score = gsm8k_score(solution_str, str(ground_truth))
        return {"score": score, "answered": bool(all_hash_answers(solution_str))}
    if all_boxed(solution_str):
        return {"score": math_score(solution_str, str(ground_truth)), "answered": True}
    lines = all_hash_answers(solution_str) or [
        a.strip() for a in _ANSWER_LINE.findall(solution_str)
    ]
    answer = single_answer(lines)
    if answer is None:
        return {"score": 0.0, "answered": False}
    gold = extract_hash_answer(str(ground_truth)) or str(ground_truth)
    return {"score": 1.0 if math_equivalent(answer, gold) else 0.0, "answered": True}


def format_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any = None,
    extra_info: dict[str, Any] | None = None,
    *,
    pattern: str,
    match_score: float = 1.0,
    miss_score: float = 0.0,
) -> float:
    """``match_score`` if ``pattern`` matches the whole response (DOTALL), else ``miss_score``."""
    return match_score if re.fullmatch(pattern, solution_str.strip(), re.DOTALL) else miss_score


_BOXED_OPTION = re.compile(r"\\boxed\{([^}]+)\}")
#: ROLL's CrossThink-QA rewards by reward_type: (correct and boxed, correct, boxed, neither)
CROSSTHINKQA_REWARDS = {
    "loose": (1.0, 1.0, -1.0, -1.0),
    "soft": (1.0, 0.5, -0.5, -1.0),
    "strict": (1.0, -1.0, -1.0, -1.0),
}


def repetition_penalty(text: str, ngram_size: int = 3, max_penalty: float = -0.5) -> float:
    """ROLL's repetition penalty: `max_penalty` times the share of repeated word n-grams."""
    words = text.lower().split()
    if len(words) < ngram_size:
        return 0.0
    grams = list(zip(*[words[i:] for i in range(ngram_size)], strict=False))
    return (1 - len(set(grams)) / len(grams)) * max_penalty


def crossthinkqa_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    reward_type: str = "soft",
) -> dict[str, Any]:
    """ROLL's CrossThink-QA multiple-choice rule: the answer after the last ``</think>`` is the
    last ``\\boxed{}`` (format kept), else what follows the last "answer is", else the whole
    text; its first capital letter is the choice, correct when it is the ground truth's first
    character. The reward by `reward_type` (``CROSSTHINKQA_REWARDS``) plus ROLL's repetition
    penalty (3-gram, at most -0.5). Extras: ``correct``, ``format_ok``, ``repetition``."""
    if reward_type not in CROSSTHINKQA_REWARDS:
        raise ValueError(f"reward_type {reward_type!r}: one of {sorted(CROSSTHINKQA_REWARDS)}")
    text = solution_str
    for token in ("<|endoftext|>", "<pad>", "<|im_end|>"):
        text = text.replace(token, "")
    end = text.rfind("</think>")
    answer = text[end + len("</think>") :].lstrip("\n") if end != -1 else text
    boxes = _BOXED_OPTION.findall(answer)
    boxed = bool(boxes)
    if boxed:
        extracted = boxes[-1]
    else:
        at = answer.lower().rfind("answer is")
        extracted = answer if at == -1 else answer[at + len("answer is") :]
    choice = next((c for c in extracted if c.isupper()), None)
    gold = str(ground_truth)
    correct = choice is not None and bool(gold) and choice == gold[0]
    table = CROSSTHINKQA_REWARDS[reward_type]
    reward = table[0 if correct and boxed else 1 if correct else 2 if boxed else 3]
    penalty = repetition_penalty(text)
    return {"score": reward + penalty, "correct": float(correct), "format_ok": float(boxed),
            "repetition": penalty}  # fmt: skip
