"""GSM8K and MATH rows from local files to verl's parquet schema (nothing is downloaded).

Offers: ``gsm8k_row(record, index, split)``, ``math_row(record, index, split)`` (one verl row:
``data_source``, ``prompt`` as chat messages, ``ability``, ``reward_model.{style,
ground_truth}``, ``extra_info``), ``read_records(path)`` (``.jsonl``, or ``.json`` holding a
list) and ``convert_file(path, out, kind, split) -> ConvertReport`` (writes parquet; a bad record
is an error naming file and row). The CLI is ``tools/convert_math_data.py``. Prompts follow
verl's ``examples/data_preprocess/{gsm8k,math_dataset}.py`` instructions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from rl_envs.rewards.extraction import extract_boxed, extract_hash_answer
from rl_envs.tasks import data

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
GSM8K_SOURCE = "openai/gsm8k"
MATH_SOURCE = "DigitalLearningGmbH/MATH-lighteval"


class ConvertError(ValueError):
    """A record that cannot be converted (file and row named)."""


def _field(record: Any, name: str) -> str:
    if not isinstance(record, dict):
        raise ValueError(f"wrong type {type(record).__name__}, expected an object")
    value = record.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"field {name!r} missing or not a non-empty string")
    return value


def gsm8k_row(record: Any, index: int, split: str) -> dict[str, Any]:
    """verl's GSM8K row from ``{"question", "answer": "... #### 42"}``."""
    question, answer = _field(record, "question"), _field(record, "answer")
    final = extract_hash_answer(answer)
    if final is None:
        raise ValueError("field 'answer' has no '#### <final answer>' line")
    return {
        "data_source": GSM8K_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {GSM8K_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": final.replace(",", "")},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def math_row(record: Any, index: int, split: str) -> dict[str, Any]:
    """verl's MATH row from ``{"problem", "solution": "... \\boxed{x} ..."}``."""
    problem, solution = _field(record, "problem"), _field(record, "solution")
    final = extract_boxed(solution)
    if final is None:
        raise ValueError("field 'solution' has no balanced \\boxed{...} answer")
    return {
        "data_source": MATH_SOURCE,
        "prompt": [{"role": "user", "content": f"{problem} {MATH_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": final},
        "extra_info": {"split": split, "index": index},
    }


CONVERTERS = {"gsm8k": gsm8k_row, "math": math_row}


def read_records(path: str) -> list[Any]:
    """Records of a ``.jsonl`` file (one per non-empty line) or a ``.json`` list, read by
    ``rl_envs.tasks.data.read_records``; the first undecodable line is a ``ConvertError``
    naming the file and the line (a converter writes all rows or none)."""
    if os.path.isdir(path):
        raise ConvertError(f"{path}: is a directory; give a .jsonl or .json file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"input file not found: {path}")
    if not path.endswith((".json", ".jsonl")):
        raise ConvertError(f"{path}: use a .jsonl or .json file")
    try:
        records, lines = data.read_records(path)
    except data.DataFileError as exc:
        raise ConvertError(str(exc)) from None
    for index, record in enumerate(records):
        error = data.bad_json(record)
        if error is not None:
            line = lines[index] if lines is not None else index + 1
            raise ConvertError(f"{path}: line {line}: invalid JSON: {error}")
    return records


def detect_kind(record: Any) -> str:
    """``gsm8k`` for question/answer records, ``math`` for problem/solution ones."""
    if isinstance(record, dict) and "question" in record and "answer" in record:
        return "gsm8k"
    if isinstance(record, dict) and "problem" in record and "solution" in record:
        return "math"
    keys = sorted(record) if isinstance(record, dict) else type(record).__name__
    raise ConvertError(
        "cannot tell GSM8K (question/answer) from MATH (problem/solution): the first record "
        f"has {keys}; rename its fields or pass --kind"
    )


@dataclass(frozen=True)
class ConvertReport:
    out: str
    kind: str
    rows: int


def convert_file(path: str, out: str, kind: str = "auto", split: str = "train") -> ConvertReport:
    """Convert every record of ``path`` and write ``out`` (parquet, atomically); any bad record
    is an error naming its row (0-based), and nothing is written."""
    if not out.endswith(".parquet") or os.path.isdir(out):
        raise ConvertError(f"{out}: the output must be a .parquet file (-o NAME.parquet)")
    records = read_records(path)
    if not records:
        raise ConvertError(f"{path}: no records")
    if kind == "auto":
        try:
            kind = detect_kind(records[0])
        except ConvertError as exc:
            raise ConvertError(f"{path}: row 0: {exc}") from None
    if kind not in CONVERTERS:
        raise ConvertError(f"unknown kind {kind!r}; use one of {sorted(CONVERTERS)} or auto")
    rows = []
    for index, record in enumerate(records):
        try:
            rows.append(CONVERTERS[kind](record, index, split))
        except ValueError as exc:
            raise ConvertError(f"{path}: row {index}: {exc}") from None
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    data.write_parquet_rows(out, rows)
    return ConvertReport(out, kind, len(rows))
