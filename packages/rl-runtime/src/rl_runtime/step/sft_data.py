"""Supervised rows from files -> token rows with a loss mask, validated, truncated, counted.

Rows (JSONL, JSON list or parquet) are either chat rows (a list of `{role, content}` messages,
or its JSON string, under `messages_key`) or prompt/response rows (ROLL's SFT keys: the user
message is `prompt_key`'s text, plus a newline and `query_key`'s text when that key is set and
the row has it; `response_key` is the assistant's answer; `system_key` an optional system
message). Both become one conversation; a prompt/response row is a conversation of one
assistant turn.

Loss mask: True exactly on the tokens of assistant turns (each assistant message's content and
the template's end-of-turn text); system, user and tool messages and the template's headers are
context only. The conversation is rendered by a chat template of rl_rollout.templates (`native`
= the tokenizer's own, or a named one such as `qwen2_5`) piece by piece: the text before each
assistant turn is `template.prefix(messages before it)`, each piece is tokenized on its own and
the ids are concatenated (never re-tokenised across a boundary, as the agent loop builds its
token rows), so a trained token is never half context. A template that renders an earlier
assistant turn differently from how it would have generated it (it drops a turn's reasoning)
fails that check and the row is refused with its number.

Malformed rows (not a mapping, a line that is not JSON, no usable messages or prompt, an empty
response, no assistant message, unknown roles) are refused together in one `SFTDataError`
naming the file and the 0-based row numbers (and the JSON line). Too long rows (more than
`sequence_length` tokens) keep their start; a row whose cut leaves no trained token is dropped.
`SFTSet.counts`: `rows`, `examples`, `truncated`, `dropped_too_long`, `trained_tokens`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rl_envs.tasks.data import RowInvalid, bad_json, chat_messages

ROLES = ("system", "user", "assistant", "tool")
"""Roles a conversation may hold; only `assistant` turns are trained on."""
MAX_CHARS = 1 << 24
"""Characters of one row's messages at most (a larger row is refused, not tokenized)."""


class SFTDataError(ValueError):
    """Malformed supervised rows (file and row numbers in the message)."""


@dataclass(frozen=True)
class SFTFields:
    """Where the rows' text is and how it becomes tokens (the SFT data plan).

    `messages_key`: column of chat messages; a row that has it is a chat row. Otherwise
    `prompt_key` (+ `query_key`) and `response_key` (+ `system_key`) make the conversation.
    `template`: a chat template name of rl_rollout.templates. `sequence_length`: tokens per
    example at most (longer ones are cut, see the module docstring)."""

    prompt_key: str = "instruction"
    response_key: str = "output"
    query_key: str | None = None
    system_key: str | None = None
    messages_key: str | None = "messages"
    template: str = "native"
    sequence_length: int = 2048


@dataclass(frozen=True)
class SFTExample:
    """One training sequence: `token_ids [T]` and `loss_mask [T]` (True = trained on: the token
    is predicted from the ones before it and counts in the loss)."""

    token_ids: tuple[int, ...]
    loss_mask: tuple[bool, ...]

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.loss_mask):
            raise ValueError(f"{len(self.token_ids)} token ids != {len(self.loss_mask)} mask flags")

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class SFTSet:
    examples: list[SFTExample]
    counts: dict[str, int]


# ------------------------------------------------------------------------------ rows -> messages
def row_messages(row: Any, fields: SFTFields) -> list[dict[str, str]]:
    """The conversation of one row (module docstring), or RowInvalid naming the field at fault."""
    if not isinstance(row, dict):
        raise RowInvalid("row", f"wrong type {type(row).__name__}, expected a mapping")
    key = fields.messages_key
    if key and row.get(key) is not None:
        value = row[key]
        if isinstance(value, str):
            import json

            try:
                value = json.loads(value)
            except (ValueError, RecursionError) as exc:
                raise RowInvalid(key, f"not a JSON list of messages: {exc}") from None
        if not isinstance(value, list | tuple):
            raise RowInvalid(key, f"wrong type {type(value).__name__}, expected messages")
        messages = chat_messages(list(value), MAX_CHARS, key)
    else:
        messages = _prompt_response(row, fields)
    for i, m in enumerate(messages):
        if m["role"] not in ROLES:
            raise RowInvalid(f"{key}[{i}].role", f"unknown role {m['role']!r}; use {ROLES}")
    if not any(m["role"] == "assistant" for m in messages):
        raise RowInvalid(key or fields.response_key, "no assistant message: nothing to train on")
    return messages


def _prompt_response(row: dict, fields: SFTFields) -> list[dict[str, str]]:
    def text(name: str) -> str:
        value = row.get(name)
        if not isinstance(value, str):
            why = "missing" if value is None else f"wrong type {type(value).__name__}"
            where = f"; the row's keys are {sorted(row)}" if value is None else ""
            raise RowInvalid(name, f"{why}, expected text{where}")
        if not value.strip():
            raise RowInvalid(name, "empty")
        return value

    user = text(fields.prompt_key)
    if fields.query_key and row.get(fields.query_key):  # ROLL: prompt + "\n" + query when set
        query = row[fields.query_key]
        if not isinstance(query, str):
            raise RowInvalid(fields.query_key, f"wrong type {type(query).__name__}, expected text")
        user = user + "\n" + query
    messages = [{"role": "user", "content": user}]
    messages.append({"role": "assistant", "content": text(fields.response_key)})
    if fields.system_key and row.get(fields.system_key):
        messages.insert(0, {"role": "system", "content": text(fields.system_key)})
    return messages


# ------------------------------------------------------------------------------ messages -> tokens
class TemplateMismatch(ValueError):
    """The template renders an earlier assistant turn unlike its generation (see module doc)."""


def encode_messages(messages: list[dict[str, str]], template: Any, tokenizer: Any) -> SFTExample:
    """Token ids and loss mask of a conversation (module docstring). `template`: an
    rl_rollout.templates.ChatTemplate. Context pieces (the prefix before each assistant turn)
    are False, each assistant turn (content + `template.end_of_turn`) True."""

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    token_ids: list[int] = []
    mask: list[bool] = []
    rendered = ""  # the text of every piece so far
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = template.prefix(messages[:i])
        if not prefix.startswith(rendered):
            raise TemplateMismatch(
                f"template {template.name!r} renders assistant turn before message {i} "
                "differently from the text it was trained to generate (one assistant turn per "
                "row, or another template)"
            )
        context = ids(prefix[len(rendered) :])
        turn = ids(message["content"] + template.end_of_turn)
        token_ids += context + turn
        mask += [False] * len(context) + [True] * len(turn)
        rendered = prefix + message["content"] + template.end_of_turn
    if mask:
        mask[0] = False  # the first token is predicted from nothing: no log-prob to train
    return SFTExample(tuple(token_ids), tuple(mask))


def fit(example: SFTExample, max_len: int) -> SFTExample | None:
    """The example, its first `max_len` tokens, or None when those hold no trained token."""
    if len(example.token_ids) <= max_len:
        return example
    cut = SFTExample(example.token_ids[:max_len], example.loss_mask[:max_len])
    return cut if cut.trained_tokens else None


# ------------------------------------------------------------------------------ files
def read_rows(path: str | Path) -> tuple[list[Any], list[int] | None]:
    """`(records, lines)` of a .jsonl, .json (a list, or JSON lines) or .parquet file
    (rl_envs.tasks.data.read_records); a file that is no table is an SFTDataError."""
    from rl_envs.tasks.data import DataFileError, read_records

    try:
        return read_records(str(path))
    except DataFileError as exc:
        raise SFTDataError(str(exc)) from None


def row_problem(row: Any, fields: SFTFields, line: int | None = None) -> str | None:
    """Why `row` cannot be trained on (None: it can): the reason naming the field."""
    where = f" (line {line})" if line is not None else ""
    if (error := bad_json(row)) is not None:
        return f"not JSON{where}: {error}"
    try:
        row_messages(row, fields)
    except RowInvalid as exc:
        return f"{exc.field_name!r}{where}: {exc.reason}"
    return None


def load_sft(files: tuple[str, ...] | list[str], tokenizer: Any, fields: SFTFields) -> SFTSet:
    """Tokenized, masked examples of `files` (every malformed row of a file refused at once,
    naming the file and rows)."""
    from rl_rollout.templates import get_template

    try:
        template = get_template(fields.template, tokenizer)
    except (KeyError, ValueError) as exc:
        raise SFTDataError(f"data_args.template={fields.template!r}: {exc}") from None
    examples: list[SFTExample] = []
    keys = ("rows", "examples", "truncated", "dropped_too_long", "trained_tokens")
    counts: dict[str, int] = dict.fromkeys(keys, 0)
    for path in files:
        records, lines = read_rows(path)
        problems: list[str] = []
        for i, row in enumerate(records):
            counts["rows"] += 1
            line = lines[i] if lines is not None else None
            if problem := row_problem(row, fields, line):
                problems.append(f"row {i}: {problem}")
                continue
            try:
                made = encode_messages(row_messages(row, fields), template, tokenizer)
            except TemplateMismatch as exc:
                problems.append(f"row {i}: {exc}")
                continue
            counts["examples"] += 1
            fitted = fit(made, fields.sequence_length)
            if fitted is None:
                counts["dropped_too_long"] += 1
                continue
            counts["truncated"] += int(fitted is not made)
            counts["trained_tokens"] += fitted.trained_tokens
            examples.append(fitted)
        if problems:
            more = f" (+{len(problems) - 20} more)" if len(problems) > 20 else ""
            raise SFTDataError(
                f"{path}: {len(problems)} malformed row(s): " + "; ".join(problems[:20]) + more
            )
    if not examples:
        raise SFTDataError(f"no usable supervised rows in {list(files)}")
    return SFTSet(examples, counts)


def first_rows_problem(path: str, fields: SFTFields, rows: int) -> str | None:
    """Why the first `rows` rows of `path` would stop `load_sft`, or None (the preflight's
    check of a data file)."""
    try:
        records, lines = read_rows(path)
    except SFTDataError as exc:
        return str(exc)
    if not records:
        return "no rows"
    problems = [
        f"row {i}: {p}"
        for i, r in enumerate(records[:rows])
        if (p := row_problem(r, fields, lines[i] if lines is not None else None))
    ]
    return (
        f"malformed row(s) among the first {rows}: " + "; ".join(problems[:3]) if problems else None
    )


# ------------------------------------------------------------------------------ batches
def collate(examples: list[SFTExample], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded rows: `input_ids [B, T]` (long), `attention_mask [B, T]` (long),
    `response_mask [B, T]` (bool: the loss mask; rl_train's log_probs[:, t] is the log-prob of
    token t given the ones before it, so the mask is aligned with the tokens)."""
    t = max(len(e.token_ids) for e in examples)
    input_ids = torch.full((len(examples), t), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(examples), t), dtype=torch.long)
    response = torch.zeros((len(examples), t), dtype=torch.bool)
    for i, e in enumerate(examples):
        n = len(e.token_ids)
        input_ids[i, :n] = torch.tensor(e.token_ids, dtype=torch.long)
        attention[i, :n] = 1
        response[i, :n] = torch.tensor(e.loss_mask, dtype=torch.bool)
    return {"input_ids": input_ids, "attention_mask": attention, "response_mask": response}


def examples_from_trajectories(
    trajectories: Sequence[Any], max_length: int | None = None
) -> list[SFTExample]:
    """Trajectories (rl_config.records.Trajectory: a warm-up's demonstrations) as SFT rows: their
    tokens, trained where their `response_mask` is True (a failed one trains on nothing), cut to
    `max_length` tokens on the right; `collate` of them equals rl_runtime.step.collate's
    `collate_trajectories` in `input_ids`, `attention_mask` and `response_mask`."""
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    out = []
    for t in trajectories:
        n = len(t.token_ids) if max_length is None else min(len(t.token_ids), max_length)
        mask = [False] * n if t.failed else [bool(m) for m in t.response_mask[:n]]
        out.append(SFTExample(tuple(t.token_ids[:n]), tuple(mask)))
    return out
