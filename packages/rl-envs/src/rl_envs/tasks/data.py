"""Rows of single-turn tasks from parquet or jsonl, validated row by row.

Two schemas: verl's (``prompt`` = chat messages, ``data_source``, ``reward_model.ground_truth``,
``extra_info``) and a plain one (``prompt`` string, ``answer``). A bad row is rejected with its row
number (0-based) and the field at fault; the other rows load.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TaskRow:
    index: int
    prompt: list[dict[str, str]]  # chat messages
    ground_truth: Any
    data_source: str
    extra_info: dict[str, Any] = field(default_factory=dict)

    @property
    def question(self) -> str:
        return next((m["content"] for m in reversed(self.prompt) if m["role"] == "user"), "")


@dataclass(frozen=True)
class RowError:
    row: int
    field: str
    reason: str

    def __str__(self) -> str:
        return f"row {self.row}: field {self.field!r}: {self.reason}"


@dataclass
class LoadReport:
    source: str
    rows: list[TaskRow]
    rejected: list[RowError]

    def summary(self) -> str:
        head = f"{self.source}: {len(self.rows)} rows loaded, {len(self.rejected)} rejected"
        return "\n".join([head, *(str(e) for e in self.rejected[:20])])


@dataclass(frozen=True)
class _BadJson:
    error: str


class RowInvalid(ValueError):
    def __init__(self, field_name: str, reason: str) -> None:
        super().__init__(reason)
        self.field_name = field_name
        self.reason = reason


def _text(value: Any, name: str, max_chars: int) -> str:
    if value is None:
        raise RowInvalid(name, "missing")
    if isinstance(value, float) and math.isnan(value):
        raise RowInvalid(name, "is NaN")
    if not isinstance(value, str):
        raise RowInvalid(name, f"wrong type {type(value).__name__}, expected str")
    if len(value) > max_chars:
        raise RowInvalid(name, f"overlong: {len(value)} characters > {max_chars}")
    if not value.strip():
        raise RowInvalid(name, "empty")
    return value


def _ground_truth(value: Any, name: str, max_chars: int) -> Any:
    if value is None:
        raise RowInvalid(name, "missing")
    if isinstance(value, bool):
        raise RowInvalid(name, "wrong type bool")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RowInvalid(name, f"is {value}")
        return str(int(value)) if value.is_integer() else str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _text(value, name, max_chars)
    if isinstance(value, dict):
        if len(json.dumps(value, default=str)) > max_chars:
            raise RowInvalid(name, f"overlong: more than {max_chars} characters")
        return value
    raise RowInvalid(name, f"wrong type {type(value).__name__}")


def _messages(value: Any, max_chars: int) -> list[dict[str, str]]:
    if isinstance(value, str) or value is None or (isinstance(value, float) and math.isnan(value)):
        return [{"role": "user", "content": _text(value, "prompt", max_chars)}]
    if not isinstance(value, list | tuple) or not value:
        raise RowInvalid("prompt", f"wrong type {type(value).__name__}, expected str or messages")
    messages = []
    total = 0
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise RowInvalid(f"prompt[{i}]", f"wrong type {type(message).__name__}, expected dict")
        role = _text(message.get("role"), f"prompt[{i}].role", 64)
        content = _text(message.get("content"), f"prompt[{i}].content", max_chars)
        total += len(content)
        if total > max_chars:
            raise RowInvalid("prompt", f"overlong: more than {max_chars} characters")
        messages.append({"role": role, "content": content})
    return messages


def validate_row(
    index: int,
    record: Any,
    *,
    max_prompt_chars: int,
    max_answer_chars: int,
    default_data_source: str,
) -> TaskRow:
    if isinstance(record, _BadJson):
        raise RowInvalid("<json>", f"invalid JSON: {record.error}")
    if not isinstance(record, dict):
        raise RowInvalid("<row>", f"wrong type {type(record).__name__}, expected an object")
    if "prompt" not in record:
        raise RowInvalid("prompt", "missing")
    prompt = _messages(record["prompt"], max_prompt_chars)
    if "reward_model" in record:
        reward_model = record["reward_model"]
        if not isinstance(reward_model, dict):
            raise RowInvalid("reward_model", f"wrong type {type(reward_model).__name__}")
        truth = _ground_truth(
            reward_model.get("ground_truth"), "reward_model.ground_truth", max_answer_chars
        )
    elif "answer" in record:
        truth = _ground_truth(record["answer"], "answer", max_answer_chars)
    else:
        raise RowInvalid("reward_model.ground_truth", "missing (neither reward_model nor answer)")
    source = record.get("data_source", default_data_source)
    source = _text(source, "data_source", 256)
    extra = record.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise RowInvalid("extra_info", f"wrong type {type(extra).__name__}, expected dict")
    return TaskRow(
        index=index, prompt=prompt, ground_truth=truth, data_source=source, extra_info=extra
    )


def validate_records(
    records: Iterable[Any],
    *,
    source: str = "<records>",
    max_prompt_chars: int = 32_000,
    max_answer_chars: int = 4_000,
    default_data_source: str = "openai/gsm8k",
) -> LoadReport:
    rows: list[TaskRow] = []
    rejected: list[RowError] = []
    for index, record in enumerate(records):
        try:
            rows.append(
                validate_row(
                    index,
                    record,
                    max_prompt_chars=max_prompt_chars,
                    max_answer_chars=max_answer_chars,
                    default_data_source=default_data_source,
                )
            )
        except RowInvalid as exc:
            rejected.append(RowError(index, exc.field_name, exc.reason))
    return LoadReport(source, rows, rejected)


def _read_jsonl(path: str) -> list[Any]:
    records: list[Any] = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                records.append(_BadJson(str(exc)))
    return records


def load_rows(path: str, **options: Any) -> LoadReport:
    """Load and validate a ``.parquet``, ``.jsonl`` or ``.json`` file."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"dataset file not found: {path}")
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError("parquet files need pyarrow: pip install 'rl-envs[data]'") from exc
        records: list[Any] = pq.read_table(path).to_pylist()
    elif path.endswith(".jsonl"):
        records = _read_jsonl(path)
    elif path.endswith(".json"):
        with open(path, encoding="utf-8") as handle:
            records = json.load(handle)
        if not isinstance(records, list):
            raise ValueError(f"{path}: expected a JSON list of rows")
    else:
        raise ValueError(f"{path}: unsupported dataset format (use .parquet, .jsonl or .json)")
    return validate_records(records, source=path, **options)
