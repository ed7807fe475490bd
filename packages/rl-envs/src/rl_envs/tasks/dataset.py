"""RLVR prompt datasets: several files, ROLL's column names, a reward domain per row.

Offers:

* ``DataSpec`` and ``data_spec(data_args, *, tag_to_domain, default_domain)`` (from ROLL's
  ``data_args`` mapping: ``file_name`` (a path or a list), ``messages``, ``prompt``, ``tag``,
  ``id``; the domain table comes from ``RewardRouterSpec.tag_to_domain()``).
* ``load_dataset(spec) -> Dataset``: rows of every file, each with its ``domain``; malformed
  rows raise ``DataError`` listing file, row number and field (``on_bad_row="skip"``: they are
  dropped and counted in ``Dataset.rejected``); rows with image/video/audio inputs always raise.
* ``filter_overlong_prompts(rows, count_tokens, max_tokens) -> (rows, OverlongReport)``:
  verl's ``filter_overlong_prompts``; ``chat_token_counter(tokenizer)`` makes ``count_tokens``
  from a HF tokenizer (chat template with the generation prompt).

Sampling and domain mixing: ``rl_envs.tasks.sampler``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from rl_envs.tasks.data import DataFileError, RowError, RowKeys, TaskRow, load_rows

logger = logging.getLogger(__name__)
MAX_LISTED_ERRORS = 20


class DataError(ValueError):
    """A dataset that cannot be used: malformed rows (listed by file and row), no rows, or
    rows of no reward domain."""


@dataclass(frozen=True)
class DataSpec:
    """Where the rows are and how to read them. ``tag_to_domain``: tag (or data source) ->
    reward domain; ``default_domain``: for rows whose tag is in no domain (None: such rows are
    an error when ``tag_to_domain`` is given)."""

    files: tuple[str, ...]
    keys: RowKeys = field(default_factory=RowKeys)
    tag_to_domain: Mapping[str, str] = field(default_factory=dict)
    default_domain: str | None = None
    on_bad_row: Literal["error", "skip"] = "error"
    max_prompt_chars: int = 32_000
    max_answer_chars: int = 4_000
    default_data_source: str = "unknown"


def _files(file_name: Any) -> tuple[str, ...]:
    if isinstance(file_name, str) and file_name.strip():
        return (file_name,)
    if isinstance(file_name, Sequence) and file_name and all(isinstance(f, str) for f in file_name):
        return tuple(file_name)
    raise DataError(f"data_args.file_name must be a path or a list of paths, got {file_name!r}")


def data_spec(
    data_args: Mapping[str, Any],
    *,
    tag_to_domain: Mapping[str, str] | None = None,
    default_domain: str | None = None,
    on_bad_row: Literal["error", "skip"] = "error",
) -> DataSpec:
    """``DataSpec`` from ROLL's ``data_args`` (a mapping, e.g. ``model_dump()`` of the section;
    the keys ``file_name``, ``messages``, ``prompt``, ``tag``, ``id``, ``response`` are read)."""
    args = data_args.model_dump() if hasattr(data_args, "model_dump") else dict(data_args)
    keys = RowKeys(
        prompt=args.get("prompt") or "prompt",
        messages=args.get("messages"),
        tag=args.get("tag") or "tag",
        id=args.get("id") or "id",
        response=args.get("response"),
    )
    return DataSpec(
        files=_files(args.get("file_name")),
        keys=keys,
        tag_to_domain=dict(tag_to_domain or {}),
        default_domain=default_domain,
        on_bad_row=on_bad_row,
    )


@dataclass
class Dataset:
    """Validated rows (domain set) and what was rejected. ``per_file``: rows kept per file."""

    rows: list[TaskRow]
    rejected: list[RowError]
    per_file: dict[str, int]

    def domains(self) -> Counter[str]:
        return Counter(r.domain or "" for r in self.rows)


def _domain(row: TaskRow, spec: DataSpec) -> str | None:
    if row.domain is not None:
        return row.domain
    for key in (row.tag, row.data_source):
        if key is not None and key in spec.tag_to_domain:
            return spec.tag_to_domain[key]
    return spec.default_domain


def _errors_text(errors: list[RowError]) -> str:
    lines = [str(e) for e in errors[:MAX_LISTED_ERRORS]]
    if len(errors) > MAX_LISTED_ERRORS:
        lines.append(f"... and {len(errors) - MAX_LISTED_ERRORS} more")
    return "\n".join(lines)


def _reasons_text(errors: list[RowError]) -> str:
    """Why rows were rejected, the most frequent reasons first (one per field and reason)."""
    if not errors:
        return ""
    counts = Counter((e.field, e.reason) for e in errors)
    reasons = [f"field {f!r}: {r} ({n} rows)" for (f, r), n in counts.most_common(3)]
    more = f"; and {len(counts) - 3} other reasons" if len(counts) > 3 else ""
    return f": all {len(errors)} rows rejected; " + "; ".join(reasons) + more


def load_dataset(spec: DataSpec) -> Dataset:
    """Rows of every file in order, each with its domain (see ``DataSpec``)."""
    rows: list[TaskRow] = []
    rejected: list[RowError] = []
    per_file: dict[str, int] = {}
    for path in spec.files:
        try:
            report = load_rows(
                path,
                keys=spec.keys,
                max_prompt_chars=spec.max_prompt_chars,
                max_answer_chars=spec.max_answer_chars,
                default_data_source=spec.default_data_source,
            )
        except DataFileError as exc:
            raise DataError(str(exc)) from None
        rejected += report.rejected
        per_file[path] = len(report.rows)
        for row in report.rows:
            domain = _domain(row, spec)
            if domain is None and spec.tag_to_domain:
                rejected.append(RowError(row.index, spec.keys.tag,
                                         f"tag {row.tag!r} is in no rewards domain's tag_included",
                                         path, line=row.line))  # fmt: skip
                continue
            rows.append(replace(row, domain=domain))
    fatal = [e for e in rejected if e.fatal]
    if fatal:  # never skipped: the rows ask for inputs this loader cannot give the model
        raise DataError(f"{len(fatal)} rows cannot be used:\n{_errors_text(fatal)}")
    if rejected and spec.on_bad_row == "error":
        raise DataError(f"{len(rejected)} malformed rows:\n{_errors_text(rejected)}")
    if rejected:
        logger.warning("dropped %d malformed rows:\n%s", len(rejected), _errors_text(rejected))
    if not rows:
        raise DataError(f"no usable rows in {list(spec.files)}" + _reasons_text(rejected))
    return Dataset(rows, rejected, per_file)


@dataclass(frozen=True)
class OverlongReport:
    """How many prompts ``filter_overlong_prompts`` dropped, their row indices per file, and
    the longest prompt seen (tokens)."""

    kept: int
    dropped: int
    longest: int
    dropped_rows: tuple[tuple[str, int], ...] = ()


def filter_overlong_prompts(
    rows: list[TaskRow], count_tokens: Callable[[list[dict[str, str]]], int], max_tokens: int
) -> tuple[list[TaskRow], OverlongReport]:
    """Drop the rows whose prompt is longer than ``max_tokens`` (``count_tokens(messages)``),
    as verl's ``filter_overlong_prompts``; the count is logged and reported."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    kept: list[TaskRow] = []
    dropped: list[tuple[str, int]] = []
    longest = 0
    for row in rows:
        n = int(count_tokens(row.prompt))
        longest = max(longest, n)
        if n > max_tokens:
            dropped.append((row.source, row.index))
        else:
            kept.append(row)
    if dropped:
        logger.warning("filtered %d of %d prompts longer than %d tokens (prompt_length)",
                       len(dropped), len(rows), max_tokens)  # fmt: skip
    return kept, OverlongReport(len(kept), len(dropped), longest, tuple(dropped))


def longest_token_chars(tokenizer: Any) -> int:
    """Characters of the vocabulary's longest token (``tokenizer.get_vocab()``; byte-level and
    sentencepiece spellings are at least as long as the text they stand for), so a text longer
    than ``(n + 1) * longest_token_chars(tok)`` has more than ``n`` tokens: known before a huge
    text is tokenized."""
    return max((len(token) for token in tokenizer.get_vocab()), default=0) or 64


def chat_token_counter(tokenizer: Any) -> Callable[[list[dict[str, str]]], int]:
    """Tokens of a prompt as the policy sees it: the chat template with the generation prompt
    when the tokenizer has one, else the concatenated contents."""

    def count(messages: list[dict[str, str]]) -> int:
        if getattr(tokenizer, "chat_template", None):
            out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = out["input_ids"] if isinstance(out, Mapping) or hasattr(out, "keys") else out
            return len(ids)
        text = "\n".join(m["content"] for m in messages)
        return len(tokenizer(text)["input_ids"])

    return count
