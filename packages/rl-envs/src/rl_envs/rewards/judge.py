"""The text side of a generative judge (ROLL's ``llm_judge`` reward domain): the prompt a judge
model is shown and the rule that reads its verdict. Pure text (no model, no torch): the model
runs on a reward worker of rl-runtime; this module decides what it is asked and what its answer
means.

Offers:

* ``JUDGE_PROMPTS``: ROLL's named judge prompts (``rewards.<d>.judge_prompt: <name>``);
  ``DEFAULT_JUDGE_PROMPT``: ROLL's prompt when none is named (a 0-10 score).
* ``resolve_judge_prompt(value, key) -> (template, verdict rule it asks for)``: a name of
  ``JUDGE_PROMPTS``, unset (the default), or a template of one's own holding ``{response}``
  (and optionally ``{question}``, ``{reference}``); anything else is a ValueError naming ``key``.
* ``judge_messages(template, question, response, reference) -> [{"role": "user", ...}]``.
* ``VERDICT_RULES``: ``yes_no`` (the first standalone yes or no decides: 1.0 or 0.0) and
  ``score_0_10`` (``Score: x`` with 0 <= x <= 10, scaled to x / 10);
  ``parse_verdict(text, rule) -> float | None``: None when the verdict cannot be read (a
  failure the caller counts, never a 0 to train on).
"""

from __future__ import annotations

import re
from collections.abc import Callable

ROLL_RLVR_JUDGE_PROMPT = """
Given a problem, determine whether the final answer in the provided (incomplete) solution process matches the reference answer.  
The reference answer may be one single option character (e.g., A, B, C, D), a numerical value, an expression, or a list of answers if multiple questions are involved.  
**The reference answer may be in Chinese or another language, but your evaluation should be language-agnostic.**  

Your task:  
- Compare the final output of the solution process with the reference answer.  
- If they **match exactly**, output **YES**.  
- If they **do not match**, output **NO**.  
- If the solution process is unclear, incomplete, or ambiguous, assume it is incorrect and output **NO**.  

Your output must be strictly **'YES'** or **'NO'**, with no additional words, punctuation, or explanation.  

---

**Question:**  
{question}  

**Solution Process (Final Step Only):**  
{response}  

**Reference Answer:**  
{reference}  

**Output:**  
"""  # noqa: W291 - ROLL's text, trailing spaces (markdown line breaks) included

DEFAULT_JUDGE_PROMPT = """
You are an expert judge evaluating the quality of a response to a given prompt.

Prompt: {question}

Response: {response}

Reference: {reference}

Please evaluate the response on a scale from 0 to 10.
Consider factors such as correctness, completeness, clarity, and relevance to the prompt.
Your evaluation should be a single number between 0 and 10.
Note output your score in the following format: Score: your score.
"""

#: ROLL's named judge prompts (roll.utils.prompt.prompt_maps) -> (template, verdict rule)
JUDGE_PROMPTS: dict[str, tuple[str, str]] = {
    "Qwen2.5-7B-Instruct-RLVR-prompt": (ROLL_RLVR_JUDGE_PROMPT, "yes_no"),
}

_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_SCORE = re.compile(r"score\s*[:=]\s*\**\s*([0-9]+(?:\.[0-9]+)?)", re.IGNORECASE)


def _yes_no(text: str) -> float | None:
    match = _YES_NO.search(text)
    if match is None:
        return None
    return 1.0 if match.group(1).lower() == "yes" else 0.0


def _score_0_10(text: str) -> float | None:
    match = _SCORE.search(text)
    if match is None:
        return None
    value = float(match.group(1))
    return value / 10.0 if 0.0 <= value <= 10.0 else None


VERDICT_RULES: dict[str, Callable[[str], float | None]] = {
    "yes_no": _yes_no,
    "score_0_10": _score_0_10,
}


def parse_verdict(text: str, rule: str) -> float | None:
    """The reward a judge's `text` gives under `rule` (``VERDICT_RULES``), or None when the
    verdict cannot be read: ``yes_no`` takes the first standalone yes/no (any case; ROLL's
    substring test would read "not" as no and "yesterday" as yes), ``score_0_10`` the first
    ``Score: x`` with x in [0, 10], scaled to [0, 1]."""
    if rule not in VERDICT_RULES:
        raise ValueError(f"unknown verdict rule {rule!r}; known: {sorted(VERDICT_RULES)}")
    return VERDICT_RULES[rule](text)


def resolve_judge_prompt(value: str | None, key: str) -> tuple[str, str]:
    """``(template, the verdict rule it asks for)`` of ``rewards.<d>.judge_prompt`` (see the
    module docstring); a ValueError names `key` for a value that is neither a known name nor a
    template with ``{response}``, or a template with other fields (ROLL falls back to its
    default prompt for an unknown name: here that is an error)."""
    if value is None:
        return DEFAULT_JUDGE_PROMPT, "score_0_10"
    if value in JUDGE_PROMPTS:
        return JUDGE_PROMPTS[value]
    if "{response}" not in value:
        raise ValueError(
            f"{key}={value!r}: neither a known judge prompt ({sorted(JUDGE_PROMPTS)}) nor a "
            "template with a {response} field"
        )
    try:
        value.format(question="", response="", reference="")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"{key}: the template's fields must be {{question}}, {{response}} and "
            f"{{reference}} (literal braces doubled): {exc!r}"
        ) from None
    return value, "yes_no"


def judge_messages(
    template: str, question: str, response: str, reference: object
) -> list[dict[str, str]]:
    """The judge's chat: one user message, `template` filled in. As ROLL, a question rendered
    with a chat template keeps only what follows its last ``user\\n``."""
    if "user\n" in question:
        question = question.split("user\n")[-1].strip()
    text = template.format(question=question, response=response, reference=reference)
    return [{"role": "user", "content": text}]
