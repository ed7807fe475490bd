"""Rule rewards of the RLVR domains, in verl's signature, run INSIDE the sandbox.

Offers: ``math_rule_score`` (math: ``\\boxed{}``, else ``####``/``Answer:``, judged by
math-verify when installed, else the string/number grader) and ``format_score`` (1.0 when the
response matches a regex, e.g. ROLL's ``format_pattern``; a regex on model output can backtrack
for ever, hence the sandbox timeout). Targets: ``rl_envs.rewards.rules:<name>``.
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
