"""Rule-based graders. They are trusted code but judge untrusted text, so they run INSIDE the
sandbox (``SandboxPool.call("rl_envs.rewards.graders:<name>", ...)``); nothing here evaluates
model output: numbers and LaTeX are parsed, and math-verify's Python-expression path is never
reached with text that looks like code."""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from rl_envs import arith
from rl_envs.rewards.extraction import (
    all_boxed,
    all_hash_answers,
    extract_boxed,
    extract_hash_answer,
    final_number,
    normalize_answer,
    single_answer,
    to_number,
)

_CODE_LIKE = re.compile(
    r"__|\bimport\b|\blambda\b|\beval\b|\bexec\b|\bos\.|\bsystem\b|\bopen\(|\bgetattr\b"
)


def looks_like_code(text: str) -> bool:
    """True for answers that contain Python-ish constructs: they are never handed to a parser
    that could evaluate them."""
    return bool(_CODE_LIKE.search(text))


def _numbers_equal(a: str, b: str) -> bool:
    x, y = to_number(a), to_number(b)
    return x is not None and y is not None and math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9)


def gsm8k_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """verl-style GSM8K: ``strict`` needs ``#### answer``; ``flexible`` also takes the last
    number. Canary rules: several ``####`` lines with different answers score 0; ``flexible``
    finds no answer in a trailing list of numbers (``"1 2 3 ... 10"``)."""
    answers = all_hash_answers(solution_str)
    answer = single_answer(answers)
    if not answers and method == "flexible":
        answer = final_number(solution_str)
    if answer is None:
        return 0.0
    gold = extract_hash_answer(str(ground_truth)) or str(ground_truth)
    return (
        score
        if _numbers_equal(answer, gold) or normalize_answer(answer) == normalize_answer(gold)
        else format_score
    )


def math_equivalent(answer: str, gold: str) -> bool:
    """Equivalence of two final answers: normalised string, number, then math-verify (if
    installed). The caller's sandbox supplies the timeout."""
    if normalize_answer(answer) == normalize_answer(gold):
        return True
    if _numbers_equal(answer, gold):
        return True
    if looks_like_code(answer) or looks_like_code(gold):
        return False
    try:
        from math_verify import LatexExtractionConfig, parse, verify
    except ImportError:
        return False
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    gold_parsed = parse(
        f"${gold}$", extraction_config=[LatexExtractionConfig()], parsing_timeout=None
    )  # type: ignore[arg-type]
    pred_parsed = parse(
        f"${answer}$", extraction_config=[LatexExtractionConfig()], parsing_timeout=None
    )  # type: ignore[arg-type]
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def math_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the boxed answer equals the ground truth, else 0.0. Several boxes that disagree
    (``\\boxed{41} or \\boxed{42}``) score 0.0; the same answer boxed twice counts once."""
    answer = single_answer(all_boxed(solution_str))
    if answer is None:
        return 0.0
    gold = extract_boxed(str(ground_truth)) or str(ground_truth)
    return 1.0 if math_equivalent(answer, gold) else 0.0


def dapo_score(solution_str: str, ground_truth: str) -> dict[str, Any]:
    """DAPO rule: +1 correct, -1 otherwise; the answer is the boxed one or ``Answer: x``
    (disagreeing boxes or ``Answer:`` lines name no answer: -1)."""
    boxed = all_boxed(solution_str)
    if boxed:
        answer = single_answer(boxed)
    else:
        answer = single_answer(
            [a.strip() for a in re.findall(r"Answer\s*:\s*([^\n]+)", solution_str)]
        )
    correct = answer is not None and math_equivalent(answer, str(ground_truth))
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": (answer or "")[:200]}


def countdown_score(
    solution_str: str,
    ground_truth: dict[str, Any],
    format_score: float = 0.1,
    score: float = 1.0,
) -> float:
    """Countdown: the ``<answer>`` equation must use each given number exactly once and equal the
    target. A well-formed but wrong equation earns ``format_score``."""
    found = re.findall(r"<answer>(.*?)</answer>", solution_str, re.DOTALL)
    if not found:
        return 0.0
    equation = found[-1].strip().split("=")[0]
    try:
        used = sorted(arith.numbers_in(equation))
        value = arith.evaluate(equation)
    except (ValueError, SyntaxError):
        return format_score
    if used != sorted(ground_truth["numbers"]):
        return format_score
    return score if abs(value - float(ground_truth["target"])) < 1e-6 else format_score


GSM8K_SOURCES = ("openai/gsm8k", "gsm8k")
MATH_SOURCES = (
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
    "math",
    "numina_aops_forum",
    "numina_synthetic_math",
    "numina_amc_aime",
    "numina_olympiads",
)


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
) -> Any:
    """verl's dispatch by ``data_source``."""
    if data_source in GSM8K_SOURCES:
        return gsm8k_score(solution_str, ground_truth)
    if data_source in MATH_SOURCES:
        return math_score(solution_str, ground_truth)
    if data_source in ("math_dapo", "dapo"):
        return dapo_score(solution_str, ground_truth)
    if data_source == "countdown":
        return countdown_score(solution_str, ground_truth)
    raise NotImplementedError(f"no reward function for data_source {data_source!r}")


def warmup() -> None:
    """Import math-verify's lazy parts in the worker (called once per worker at start)."""
    math_equivalent("\\frac{1}{2}", "0.5")
    math_equivalent("x^2+1", "1+x^2")


def answer_score(answer: str, ground_truth: str) -> float:
    """1.0 if a bare final answer equals the ground truth (tool env), else 0.0."""
    return 1.0 if math_equivalent(str(answer), str(ground_truth)) else 0.0
