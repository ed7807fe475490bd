"""Preference rows from files -> token rows, validated, truncated by a documented rule, counted.

Rows (JSONL, JSON list or parquet): a prompt (text under `prompt_key`, or chat messages under
`messages_key`), and either a pair (`chosen_key`, `rejected_key`: text, or messages whose
assistant contents are the response) or, for KTO, an unpaired row (`completion_key` + a boolean
`label_key`). The chat template is applied once to the prompt (`add_generation_prompt`); the
response ends with the tokenizer's EOS. Prompt tokens are masked out of the loss.

Malformed rows (no prompt, a prompt that is neither text nor `{role, content}` messages, missing
chosen, a response that is neither text nor messages with text contents, empty rejected,
identical pair, non-boolean label, a line that is not JSON) are refused
together in one `PreferenceDataError` naming the file and the 0-based row numbers; so is a file
that is no table (a corrupt parquet file, a .json that holds no list).
Too long rows (prompt + response > `sequence_length`; a text longer than `sequence_length + 1`
times the vocabulary's longest token in characters is known too long before it is tokenized: a
prompt is dropped, a response cut to that many characters first): `keep_start` cuts the response's end and
drops a row whose prompt leaves no response token (or whose two cut responses become identical);
`drop` drops every too-long row. `PreferenceSet.counts` has `rows` (read), `examples` (made from
them: one per pair, two per pair for KTO, one per unpaired row), and `truncated`,
`dropped_too_long`, counted in examples (a KTO pair row's two may fare differently).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rl_envs.tasks.data import RowInvalid, bad_json, chat_messages
from rl_envs.tasks.dataset import longest_token_chars


class PreferenceDataError(ValueError):
    """Malformed preference rows (file and row numbers in the message)."""


@dataclass(frozen=True)
class Example:
    """One trainable example: a pair (`rejected` set) or a KTO row (`desirable` set)."""

    prompt: tuple[int, ...]
    chosen: tuple[int, ...]
    rejected: tuple[int, ...] | None = None
    desirable: bool | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass
class PreferenceSet:
    examples: list[Example]
    counts: dict[str, int]


def read_rows(path: str | Path) -> list[Any]:
    """Rows of a .jsonl, .json (a list) or .parquet file (rl_envs.tasks.data.read_records): a
    line that is not UTF-8 or JSON is a row `_row_problem` refuses with its line; a file that is
    no table at all (a corrupt parquet file, a .json that is not a list) a PreferenceDataError."""
    from rl_envs.tasks.data import DataFileError, read_records

    try:
        records, lines = read_records(str(path))
    except DataFileError as exc:
        raise PreferenceDataError(str(exc)) from None
    except ImportError as exc:  # pragma: no cover - pyarrow comes with rl-runtime[data]
        raise PreferenceDataError(
            f"{path}: reading parquet needs pyarrow (pip install rl-runtime[data])"
        ) from exc
    if lines is None:
        return records
    return [_NotJson(bad, line) if (bad := bad_json(r)) else r for r, line in zip(records, lines)]


@dataclass(frozen=True)
class _NotJson:
    """A JSON-lines row that could not be decoded: its parser's error and its line."""

    error: str
    line: int


def _response(value: Any, name: str) -> str:
    """A present response as text: a string, or the contents of a message list (its assistant
    messages when it has any; entries that are not messages are passed over). Anything else, and
    a kept message whose content is not text, raises RowInvalid naming the field."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise RowInvalid(name, f"wrong type {type(value).__name__}, expected str or messages")
    messages = [(i, m) for i, m in enumerate(value) if isinstance(m, dict)]
    if any(m.get("role") == "assistant" for _, m in messages):
        messages = [(i, m) for i, m in messages if m.get("role") == "assistant"]
    parts = []
    for i, message in messages:
        content = message.get("content")
        if not isinstance(content, str):
            why = "missing" if content is None else f"wrong type {type(content).__name__}"
            raise RowInvalid(f"{name}[{i}].content", f"{why}, expected str")
        parts.append(content)
    return "".join(parts)


class Tokenizer:
    """Prompt and response tokenization with the chat template applied once."""

    def __init__(self, tokenizer: Any, use_template: bool = True, max_tokens: int = 0) -> None:
        self.tok = tokenizer
        self.use_template = use_template and getattr(tokenizer, "chat_template", None)
        self.eos = tokenizer.eos_token_id
        #: texts longer than this have more than `max_tokens` tokens whatever they hold (no
        #: token of the vocabulary spells more characters than the longest one)
        self.max_tokens = max_tokens
        self.char_limit = (max_tokens + 1) * longest_token_chars(tokenizer) if max_tokens else 0

    def too_long(self, value: Any) -> bool:
        """A prompt (text or messages) with more than `max_tokens` tokens, told by its length
        before it is tokenized (a 50 MB row took minutes in the tokenizer)."""
        if not self.char_limit:
            return False
        if isinstance(value, str):
            return len(value) > self.char_limit
        return sum(len(str(m.get("content", ""))) for m in value) > self.char_limit

    def prompt(self, value: Any) -> list[int]:
        if self.too_long(value):  # dropped by the length rule whatever the template adds
            return [0] * (self.max_tokens + 1)
        messages = [{"role": "user", "content": value}] if isinstance(value, str) else value
        if self.use_template:
            text = self.tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        else:
            text = value if isinstance(value, str) else "\n".join(m["content"] for m in messages)
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def response(self, text: str) -> list[int]:
        if self.char_limit and len(text) > self.char_limit:
            text = text[: self.char_limit]  # still more tokens than fit: the cut comes later
        ids = list(self.tok(text, add_special_tokens=False)["input_ids"])
        return ids + ([self.eos] if self.eos is not None else [])


def load_preferences(
    files: tuple[str, ...] | list[str],
    tokenizer: Any,
    data: Any,
    *,
    paired: bool,
) -> PreferenceSet:
    """Tokenized examples of `files` under the plan `data` (rl_runtime.pipelines.dpo.compose.PreferenceData);
    `paired=False` (KTO) turns each pair into a desirable and an undesirable example."""
    tok = Tokenizer(tokenizer, data.template == "native", max_tokens=data.sequence_length)
    examples: list[Example] = []
    counts = {"rows": 0, "examples": 0, "truncated": 0, "dropped_too_long": 0}
    for path in files:
        rows = read_rows(path)
        problems: list[str] = []
        for i, row in enumerate(rows):
            counts["rows"] += 1
            problem = _row_problem(row, data)
            if problem:
                problems.append(f"row {i}: {problem}")
                continue
            made = _examples(row, tok, data, paired)
            counts["examples"] += len(made)
            for ex in made:
                fitted = _fit(ex, data.sequence_length, data.truncation_mode)
                if fitted is None:
                    counts["dropped_too_long"] += 1
                    continue
                counts["truncated"] += int(fitted != ex)
                examples.append(fitted)
        if problems:
            more = f" (+{len(problems) - 20} more)" if len(problems) > 20 else ""
            keys = (
                f"; no row is usable, the first row's keys are {sorted(rows[0])}"
                if len(problems) == len(rows) and isinstance(rows[0], dict)
                else ""
            )
            raise PreferenceDataError(
                f"{path}: {len(problems)} malformed row(s): "
                + "; ".join(problems[:20])
                + more
                + keys
            )
    if not examples:
        raise PreferenceDataError(f"no usable preference rows in {list(files)}")
    return PreferenceSet(examples, counts)


def first_rows_problem(path: str, d: Any, rows: int) -> str | None:
    """Why the first `rows` rows of `path` would stop `load_preferences` (it refuses a file with
    any malformed row), or None: the preflight's check of a preference file (`d`: the
    PreferenceData plan)."""
    try:
        records = read_rows(path)
    except PreferenceDataError as exc:
        return str(exc)
    if not records:
        return "no rows"
    problems = [f"row {i}: {p}" for i, r in enumerate(records[:rows]) if (p := _row_problem(r, d))]
    return (
        f"malformed row(s) among the first {rows}: " + "; ".join(problems[:3]) if problems else None
    )


def _row_problem(row: Any, d: Any) -> str | None:
    if isinstance(row, _NotJson):
        return f"line {row.line} is not JSON: {row.error}"
    if not isinstance(row, dict):
        return "not a mapping"
    prompt = row.get(d.messages_key) if d.messages_key else row.get(d.prompt_key)
    if not prompt:
        which = "messages_key" if d.messages_key else "prompt_key"
        return f"missing or empty prompt ({d.messages_key or d.prompt_key!r}, {which})"
    try:  # the chat template and the tokenizer take text or {role, content} messages only
        chat_messages(prompt, sys.maxsize, d.messages_key or d.prompt_key)
    except RowInvalid as exc:
        return f"prompt {exc.field_name!r}: {exc.reason}"
    if d.label_key in row and d.completion_key in row:
        if not isinstance(row[d.label_key], bool):
            return f"{d.label_key!r} must be true or false, got {row[d.label_key]!r}"
        return _response_problem(row, d.completion_key, "completion_key")
    for key, which in ((d.chosen_key, "chosen_key"), (d.rejected_key, "rejected_key")):
        if problem := _response_problem(row, key, which):
            return problem
    if _response(row[d.chosen_key], "") == _response(row[d.rejected_key], ""):
        return f"identical {d.chosen_key!r} and {d.rejected_key!r}"
    return None


def _response_problem(row: dict, key: str, which: str) -> str | None:
    """Why `row[key]` is no usable response (missing, not text or messages, empty), or None."""
    if row.get(key) is None:
        return f"missing {key!r} ({which})"
    try:
        text = _response(row[key], key)
    except RowInvalid as exc:
        return f"{exc.field_name!r}: {exc.reason}"
    return None if text.strip() else f"empty {key!r}"


def _examples(row: dict, tok: Tokenizer, d: Any, paired: bool) -> list[Example]:
    prompt = tuple(tok.prompt(row[d.messages_key] if d.messages_key else row[d.prompt_key]))
    meta = {k: v for k, v in row.items() if k == "answer"}
    if d.label_key in row and d.completion_key in row:
        if paired:
            raise PreferenceDataError(
                f"an unpaired row ({d.label_key!r}, {d.completion_key!r}) needs loss_type kto"
            )
        resp = tuple(tok.response(_response(row[d.completion_key], d.completion_key)))
        return [Example(prompt, resp, desirable=bool(row[d.label_key]), meta=meta)]
    chosen = tuple(tok.response(_response(row[d.chosen_key], d.chosen_key)))
    rejected = tuple(tok.response(_response(row[d.rejected_key], d.rejected_key)))
    if paired:
        return [Example(prompt, chosen, rejected, meta=meta)]
    return [
        Example(prompt, chosen, desirable=True, meta=meta),
        Example(prompt, rejected, desirable=False, meta=meta),
    ]


def _fit(ex: Example, max_len: int, mode: str) -> Example | None:
    """The rule of the module docstring: the example, a truncated copy, or None (dropped)."""
    sides = [ex.chosen] + ([ex.rejected] if ex.rejected is not None else [])
    if all(len(ex.prompt) + len(s) <= max_len for s in sides):
        return ex
    room = max_len - len(ex.prompt)
    if mode == "drop" or room < 1:
        return None
    chosen = ex.chosen[:room]
    rejected = None if ex.rejected is None else ex.rejected[:room]
    if rejected is not None and chosen == rejected:
        return None
    return Example(ex.prompt, chosen, rejected, ex.desirable, ex.meta)


def collate(examples: list[Example], pad_token_id: int, ids: list[int]) -> dict[str, torch.Tensor]:
    """Right-padded token rows of `examples` (rl_train.preference's layout): pairs interleave
    chosen/rejected rows (`pair_side`, `pair_id` = the example's index in `ids`); KTO rows carry
    `desirable`. Shapes: `[R, T]` token tensors, `[R]` per-row tensors (R = 2 x pairs or rows)."""
    seqs, sides, pids, desirable = [], [], [], []
    for ex, pid in zip(examples, ids):
        for side, resp in enumerate([ex.chosen] + ([ex.rejected] if ex.rejected else [])):
            seqs.append((ex.prompt, resp))
            sides.append(side)
            pids.append(pid)
            desirable.append(bool(ex.desirable) if ex.desirable is not None else side == 0)
    t = max(len(p) + len(r) for p, r in seqs)
    input_ids = torch.full((len(seqs), t), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), t), dtype=torch.long)
    response = torch.zeros((len(seqs), t), dtype=torch.bool)
    for i, (p, r) in enumerate(seqs):
        n = len(p) + len(r)
        input_ids[i, :n] = torch.tensor(p + r)
        attention[i, :n] = 1
        response[i, len(p) : n] = True
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "response_mask": response,
        "pair_side": torch.tensor(sides),
        "pair_id": torch.tensor(pids),
        "desirable": torch.tensor(desirable),
    }
