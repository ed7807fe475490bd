"""Rows of single-turn tasks from parquet or jsonl, validated row by row.

Offers: ``TaskRow`` (one validated prompt row), ``RowKeys`` (column names, ROLL's ``data_args``
names), ``validate_records``/``load_rows`` (one file -> ``LoadReport`` of rows and ``RowError``s
naming file, row and field), ``read_records`` (one file's raw records, ``DataFileError`` for a
file that is no table; ``bad_json`` for an undecodable line) and ``chat_messages`` (a prompt
checked as chat messages) for loaders of other row kinds (preference pairs). Multi-file
loading with domains: ``rl_envs.tasks.dataset``.

Schemas: verl's (``prompt`` = chat messages, ``data_source``, ``ability``,
``reward_model.{style,ground_truth}``, ``extra_info``), ROLL's (``messages`` = chat messages or
their JSON string, or ``prompt`` = text; ``ground_truth``; ``tag``; ``id``; optional ``domain``;
code rows ``test_cases``/``case_type``) and a plain one (``prompt`` string, ``answer``). A bad row
is rejected with its row number (0-based), in a JSON-lines file also its line (1-based, blank
lines counted), and the field at fault; the other rows load. A line that is not UTF-8 or JSON,
or nests too deeply for the parser, is such a row.
"""

from __future__ import annotations

import io
import json
import math
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RowKeys:
    """Column names of a row (ROLL ``data_args``: ``messages``, ``prompt``, ``tag``, ``id``).

    ``messages``: column of chat messages (a list or its JSON string); when set and present in a
    row it wins over ``prompt``. ``prompt``: column of a text prompt or (verl) chat messages.
    ``domain``: column naming the reward domain of a row (ROLL), else the tag decides.
    ``response``: column of the reference answer (ROLL's ``data_args.response``), read when a row
    has neither verl's ``reward_model``, ``ground_truth`` nor ``answer``.
    """

    prompt: str = "prompt"
    messages: str | None = None
    tag: str = "tag"
    id: str = "id"
    domain: str = "domain"
    response: str | None = None


DEFAULT_KEYS = RowKeys()


@dataclass(frozen=True)
class TaskRow:
    """One validated prompt row. ``prompt``: chat messages (a text prompt becomes one user
    message; ``is_chat`` False remembers it was text). ``tag``: the row's tag column, else its
    ``data_source``. ``domain``: reward domain (set by ``rl_envs.tasks.dataset``; None until
    then unless the row names one). ``columns``: the row's other raw columns (JSON-able), passed
    to TRL-style reward functions. ``source``: the file it came from."""

    index: int
    prompt: list[dict[str, str]]  # chat messages
    ground_truth: Any
    data_source: str
    extra_info: dict[str, Any] = field(default_factory=dict)
    tag: str | None = None
    domain: str | None = None
    row_id: Any = None
    is_chat: bool = True
    columns: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    line: int | None = None  # of a JSON-lines file, 1-based

    @property
    def prompt_text(self) -> str | list[dict[str, str]]:
        """The prompt as the file gave it: text for a text prompt, else the messages."""
        return self.prompt if self.is_chat else self.prompt[-1]["content"]

    @property
    def question(self) -> str:
        return next((m["content"] for m in reversed(self.prompt) if m["role"] == "user"), "")


@dataclass(frozen=True)
class RowError:
    """A rejected row. ``fatal``: the row asks for something no loader here supports (image
    inputs), so the dataset is refused rather than the row skipped."""

    row: int
    field: str
    reason: str
    source: str = ""  # the file
    fatal: bool = False
    line: int | None = None  # of a JSON-lines file, 1-based (blank lines counted)

    def __str__(self) -> str:
        where = f"{self.source}: " if self.source else ""
        at = f" (line {self.line})" if self.line is not None else ""
        return f"{where}row {self.row}: field {self.field!r}: {self.reason}{at}"


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
    fatal = False

    def __init__(self, field_name: str, reason: str) -> None:
        super().__init__(reason)
        self.field_name = field_name
        self.reason = reason


class RowMultimodal(RowInvalid):
    """A row with image/video/audio inputs: the prompts here are text only, and dropping the
    images would train on prompts that refer to pictures the model never sees."""

    fatal = True


MULTIMODAL_COLUMNS = ("image", "images", "video", "videos", "audio", "audios", "multi_modal_data")
"""Columns that carry non-text inputs (ROLL's and verl's vision datasets)."""
_MULTIMODAL = "multimodal inputs are not implemented (text prompts only)"


def _refuse_multimodal(record: dict[str, Any]) -> None:
    for name in MULTIMODAL_COLUMNS:
        value = record.get(name)
        if not (value is None or value == "" or value == [] or value == {}):
            raise RowMultimodal(name, f"{name} input: {_MULTIMODAL}")


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


def chat_messages(value: Any, max_chars: int, name: str = "prompt") -> list[dict[str, str]]:
    """A prompt as chat messages: a text (one user message) or a non-empty list of
    ``{"role": str, "content": str}`` of at most ``max_chars`` characters in all; anything else
    raises ``RowInvalid`` (a ValueError) naming the field (``name[i].content``)."""
    return _messages(value, max_chars, name)


def _messages(value: Any, max_chars: int, name: str = "prompt") -> list[dict[str, str]]:
    if isinstance(value, str) or value is None or (isinstance(value, float) and math.isnan(value)):
        return [{"role": "user", "content": _text(value, name, max_chars)}]
    if isinstance(value, list | tuple) and not value:
        raise RowInvalid(name, "empty: a list of no messages")
    if not isinstance(value, list | tuple):
        raise RowInvalid(name, f"wrong type {type(value).__name__}, expected str or messages")
    messages = []
    total = 0
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise RowInvalid(f"{name}[{i}]", f"wrong type {type(message).__name__}, expected dict")
        role = _text(message.get("role"), f"{name}[{i}].role", 64)
        parts = message.get("content")
        if isinstance(parts, list | tuple) and any(
            isinstance(p, dict) and p.get("type", "text") != "text" for p in parts
        ):
            raise RowMultimodal(f"{name}[{i}].content", f"image/video content part: {_MULTIMODAL}")
        content = _text(parts, f"{name}[{i}].content", max_chars)
        total += len(content)
        if total > max_chars:
            raise RowInvalid(name, f"overlong: more than {max_chars} characters")
        messages.append({"role": role, "content": content})
    return messages


def _chat_messages(value: Any, max_chars: int, name: str) -> list[dict[str, str]]:
    """ROLL's ``messages`` column: a list of messages or its JSON string."""
    if isinstance(value, str):
        if len(value) > max_chars * 2:
            raise RowInvalid(name, f"overlong: {len(value)} characters")
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise RowInvalid(name, f"not a JSON list of messages: {exc}") from None
        except RecursionError:
            raise RowInvalid(name, "not a JSON list of messages: nested too deeply") from None
    if not isinstance(value, list | tuple):
        raise RowInvalid(name, f"wrong type {type(value).__name__}, expected a list of messages")
    return _messages(value, max_chars, name)


def _prompt(record: dict[str, Any], keys: RowKeys, max_chars: int) -> tuple[list, bool]:
    """``(messages, is_chat)`` from the messages column, else the prompt column."""
    if keys.messages is not None and record.get(keys.messages) is not None:
        return _chat_messages(record[keys.messages], max_chars, keys.messages), True
    if keys.prompt not in record:
        named = f"{keys.messages!r} or {keys.prompt!r}" if keys.messages else repr(keys.prompt)
        raise RowInvalid(keys.prompt, f"missing (no column {named}; columns: {sorted(record)})")
    value = record[keys.prompt]
    return _messages(value, max_chars, keys.prompt), not isinstance(value, str)


def _truth(record: dict[str, Any], max_chars: int, keys: RowKeys = DEFAULT_KEYS) -> Any:
    """The ground truth: verl's ``reward_model.ground_truth``, ROLL's ``ground_truth``, the
    plain ``answer``, the ``keys.response`` column; None for a code row that carries only
    ``test_cases``."""
    if "reward_model" in record and record["reward_model"] is not None:
        reward_model = record["reward_model"]
        if not isinstance(reward_model, dict):
            raise RowInvalid("reward_model", f"wrong type {type(reward_model).__name__}")
        return _ground_truth(
            reward_model.get("ground_truth"), "reward_model.ground_truth", max_chars
        )
    for name in ("ground_truth", "answer", *((keys.response,) if keys.response else ())):
        if name in record and not (_blank(record[name]) and _has_tests(record)):
            return _ground_truth(record[name], name, max_chars)
    if _has_tests(record):
        return None
    raise RowInvalid(
        "reward_model.ground_truth",
        "missing (neither reward_model, ground_truth, answer nor test_cases)",
    )


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _has_tests(record: dict[str, Any]) -> bool:
    return not _blank(record.get("test_cases"))


def _optional_text(record: dict[str, Any], name: str, limit: int) -> str | None:
    value = record.get(name)
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    return _text(value, name, limit)


def _jsonable(value: Any) -> Any:
    """Parquet gives numpy-free Python values already; tuples become lists."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def validate_row(
    index: int,
    record: Any,
    *,
    max_prompt_chars: int,
    max_answer_chars: int,
    default_data_source: str,
    keys: RowKeys = DEFAULT_KEYS,
    source: str = "",
    line: int | None = None,
) -> TaskRow:
    if isinstance(record, _BadJson):
        raise RowInvalid("<json>", f"invalid JSON: {record.error}")
    if not isinstance(record, dict):
        raise RowInvalid("<row>", f"wrong type {type(record).__name__}, expected an object")
    _refuse_multimodal(record)
    prompt, is_chat = _prompt(record, keys, max_prompt_chars)
    truth = _truth(record, max_answer_chars, keys)
    if truth is None or _has_tests(record):
        from rl_envs.rewards.code_tests import parse_test_cases

        try:
            parse_test_cases(record.get("test_cases"), record.get("case_type"), truth)
        except ValueError as exc:
            raise RowInvalid("test_cases", str(exc)) from None
    data_source = _text(record.get("data_source", default_data_source), "data_source", 256)
    extra = record.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise RowInvalid("extra_info", f"wrong type {type(extra).__name__}, expected dict")
    tag = _optional_text(record, keys.tag, 256) or data_source
    domain = _optional_text(record, keys.domain, 256)
    used = {keys.prompt, keys.messages, "reward_model", "extra_info", "data_source"}
    columns = {k: _jsonable(v) for k, v in record.items() if k not in used}
    return TaskRow(
        index=index,
        prompt=prompt,
        ground_truth=truth,
        data_source=data_source,
        extra_info=_jsonable(extra),
        tag=tag,
        domain=domain,
        row_id=record.get(keys.id, index),
        is_chat=is_chat,
        columns=columns,
        source=source,
        line=line,
    )


def validate_records(
    records: Iterable[Any],
    *,
    source: str = "<records>",
    max_prompt_chars: int = 32_000,
    max_answer_chars: int = 4_000,
    default_data_source: str = "openai/gsm8k",
    keys: RowKeys = DEFAULT_KEYS,
    lines: Sequence[int] | None = None,
) -> LoadReport:
    """``lines``: the file line of each record (JSON lines), named in its errors."""
    rows: list[TaskRow] = []
    rejected: list[RowError] = []
    for index, record in enumerate(records):
        line = lines[index] if lines is not None else None
        try:
            rows.append(
                validate_row(
                    index,
                    record,
                    max_prompt_chars=max_prompt_chars,
                    max_answer_chars=max_answer_chars,
                    default_data_source=default_data_source,
                    keys=keys,
                    source=source,
                    line=line,
                )
            )
        except RowInvalid as exc:
            rejected.append(RowError(index, exc.field_name, exc.reason, source, exc.fatal, line))
        except RecursionError:  # a value nested as deep as the parser allows
            rejected.append(RowError(index, "<row>", "nested too deeply", source, False, line))
    return LoadReport(source, rows, rejected)


def _decode_line(text: str) -> Any:
    """One JSON line (its undecodable bytes kept as lone surrogates), or ``_BadJson``."""
    try:
        return json.loads(text.encode("utf-8", "surrogateescape").decode("utf-8"))
    except UnicodeDecodeError as exc:
        return _BadJson(f"byte {exc.object[exc.start]:#04x} at offset {exc.start} is not UTF-8")
    except json.JSONDecodeError as exc:
        return _BadJson(str(exc))
    except RecursionError:
        return _BadJson("nested too deeply")


def _read_jsonl(path: str) -> tuple[list[Any], list[int]]:
    """``(records, lines)``: each non-blank line's record and its line number (1-based)."""
    records: list[Any] = []
    lines: list[int] = []
    raw = open_regular(path)
    with io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape") as handle:
        for number, text in enumerate(handle, start=1):
            if text.strip():
                records.append(_decode_line(text))
                lines.append(number)
    return records, lines


def open_regular(path: str) -> io.BufferedReader:
    """``path`` opened for reading, refused unless it is a regular file (after symlinks): a
    named pipe, a device or a socket given as a data file would block or never end. Opened
    without blocking and checked through the descriptor, so nothing can swap it in between."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(f"dataset file not found: {path}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _FILE_KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise DataFileError(
                f"{path}: {kind}, not a regular file: data files must be regular files"
            )
        os.set_blocking(fd, True)
        return open(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


_FILE_KINDS = {stat.S_IFIFO: "a named pipe", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket",
               stat.S_IFDIR: "a directory"}  # fmt: skip


def require_files(key: str, paths: Sequence[str]) -> None:
    """Raise ``FileNotFoundError`` naming the config ``key`` and every path of ``paths`` that
    does not exist (before anything is loaded)."""
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise FileNotFoundError(f"{key}: dataset file not found: {', '.join(missing)}")


def load_rows(path: str, **options: Any) -> LoadReport:
    """Load and validate a ``.parquet``, ``.jsonl`` or ``.json`` file (a list, or JSON lines
    as ROLL's ``dataset_type: json`` files often are)."""
    records, lines = read_records(path)
    return validate_records(records, source=path, lines=lines, **options)


class DataFileError(ValueError):
    """A data file that cannot be read as rows at all (not parquet, not a JSON list, an
    unknown suffix); the message names the file."""


def read_records(path: str) -> tuple[list[Any], list[int] | None]:
    """``(records, lines)`` of a ``.parquet``, ``.jsonl`` or ``.json`` file, unvalidated:
    ``lines`` is each record's line (1-based) in a JSON-lines file, else None. A line that is
    not UTF-8 or JSON is a ``bad_json(record)`` record (its error in ``bad_json``), not an
    exception; a file that is no such table raises ``DataFileError`` naming it (a corrupt
    parquet file included: pyarrow's own error otherwise)."""
    open_regular(path).close()  # a clear error for a missing or non-regular file, by name
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError("parquet files need pyarrow: pip install 'rl-envs[data]'") from exc
        from pyarrow import ArrowException

        try:
            with open_regular(path) as handle:
                records: list[Any] = pq.read_table(handle).to_pylist()
        except (ArrowException, OSError) as exc:
            raise DataFileError(f"{path}: not a readable parquet file: {exc}") from None
        lines = None
    elif path.endswith(".jsonl"):
        records, lines = _read_jsonl(path)
    elif path.endswith(".json"):
        with open_regular(path) as handle:
            data = handle.read()
        try:
            records, lines = json.loads(data.decode("utf-8")), None
        except (ValueError, RecursionError):  # JSON lines named .json, as HF's json loader reads
            records, lines = _read_jsonl(path)
        if not isinstance(records, list):
            raise DataFileError(f"{path}: expected a JSON list of rows or JSON lines")
    else:
        raise DataFileError(f"{path}: unsupported dataset format (use .parquet, .jsonl or .json)")
    return records, lines


def write_parquet_rows(path: str | os.PathLike[str], rows: Sequence[dict[str, Any]]) -> None:
    """Write ``rows`` to the parquet file ``path`` atomically: a temporary file beside it, then
    a rename (a reader sees the old file or the new one, never half of one; a failed write
    leaves no temporary file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.fspath(path)
    tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        pq.write_table(pa.Table.from_pylist(list(rows)), tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def bad_json(record: Any) -> str | None:
    """The error of a record ``read_records`` could not decode (None for a decoded one)."""
    return record.error if isinstance(record, _BadJson) else None
