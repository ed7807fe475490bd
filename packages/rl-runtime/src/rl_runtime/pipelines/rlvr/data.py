"""The RLVR recipe's prompts from rl_envs: prompt rows, tokenized, and the resumable sampler.

Rows come from `rl_envs.tasks.dataset` (verl's parquet schema, ROLL's jsonl with the columns
`data_args` names; malformed rows are reported by file, row and field and skipped), each with its
reward domain from the `rewards` section (`RewardRouterSpec`). `load_rlvr_prompts`
gives a run's tokenized training and held-out prompts, its data/* metrics and its sampler. Sampling is
`rl_envs.tasks.sampler.PromptSampler` (ROLL's `domain_interleave_probs`, resumable). Rewards:
rl_runtime.pipelines.rlvr.scoring.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from rl_envs.rewards.router import RewardRouterSpec
from rl_envs.tasks.data import RowKeys, TaskRow
from rl_envs.tasks.dataset import DataError, DataSpec, load_dataset
from rl_envs.tasks.sampler import PromptSampler, domain_quotas
from rl_runtime.pipelines.rlvr.compose import DataPlan, RlvrPlan

UNNAMED_DATA_SOURCE = "unknown"
"""The data_source of a row that names none (ROLL-style jsonl rows often do not)."""


@dataclass
class ArithDataOptions:
    """Task prompts written to parquet (verl's schema) before the run; held-out problems are
    disjoint from training problems (see rl_envs.tasks.arith)."""

    generate: bool = False
    out_dir: str = "./output/rlvr_data"
    #: `max` (largest of num_digits digits) or `add` (a+b)
    kind: str = "max"
    num_digits: int = 4
    max_a: int = 99
    max_b: int = 9
    #: share of the distinct problems held out (one prompt each; rl_envs.tasks.arith.split)
    val_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        """Refused when read (a dry run too), not when the run writes the files."""
        where = "rlvr_app.arith_data"
        from rl_envs.tasks.arith import ARITH_KINDS

        if self.kind not in ARITH_KINDS:
            raise ValueError(
                f"{where}.kind={self.kind!r}: use {' or '.join(map(repr, ARITH_KINDS))}"
            )
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"{where}.val_fraction={self.val_fraction}: must be in (0, 1)")
        for name in ("num_digits", "max_a", "max_b"):
            least = 1 if name == "num_digits" else 0
            if getattr(self, name) < least:
                raise ValueError(f"{where}.{name}={getattr(self, name)}: must be >= {least}")

    def unread_by(self, data: DataPlan) -> str | None:
        """With `generate`, why the run would not read what it writes (no data key names either
        generated file: it would train on other files, perhaps an earlier generation's, while
        the keys set here did nothing); None when it does."""
        import os

        from rl_envs.tasks.arith import arith_parquet_paths

        if not self.generate:
            return None
        written = [os.path.abspath(p) for p in arith_parquet_paths(self.out_dir)]
        read = {os.path.abspath(f) for f in (*data.train_files, *data.val_files)}
        if read.intersection(written):
            return None
        return (
            f"rlvr_app.arith_data.generate writes {written[0]} and {written[1]}, but no data key "
            f"reads them (actor_train.data_args.file_name={list(data.train_files)}, "
            f"{data.val_files_key}={list(data.val_files)}): point file_name at "
            f"{self.out_dir}/train.parquet (and the held-out key at test.parquet), or set "
            "rlvr_app.arith_data.generate=false to train on your own files"
        )

    def write(self) -> None:
        """The train/test parquet files under `out_dir` (rl_envs.tasks.arith)."""
        from rl_envs.tasks.arith import write_arith_parquet

        write_arith_parquet(self.out_dir, kind=self.kind, num_digits=self.num_digits,
                            max_a=self.max_a, max_b=self.max_b, val_fraction=self.val_fraction,
                            seed=self.seed)  # fmt: skip


def first_rows_problem(path: str, plan: DataPlan, rows: int = 8) -> str | None:
    """What is wrong with the first `rows` rows of the data file `path` read with `plan`'s
    columns (the preflight: rl_runtime.run.preflight.DataFiles), None when one of them parses."""
    from rl_envs.tasks.data import DataFileError, read_records, validate_records

    try:
        records, lines = read_records(path)
    except (DataFileError, ImportError, OSError) as exc:
        return str(exc)
    if not records:
        return "has no rows"
    keys = RowKeys(prompt=plan.prompt_key or "prompt", messages=plan.messages_key,
                   tag=plan.tag_key, response=plan.response_key)  # fmt: skip
    report = validate_records(records[:rows], source=path, keys=keys,
                              lines=lines[:rows] if lines is not None else None)  # fmt: skip
    if report.rows:
        return None
    return f"none of its first {min(rows, len(records))} rows can be used: " + "; ".join(
        str(e) for e in report.rejected[:3]
    )


def preflight_data(plan: DataPlan, generated: Sequence[Any] = ()) -> tuple[Any, ...]:
    """The `rl_runtime.run.preflight.DataFiles` of an RLVR run: its training and held-out files
    (those in `generated`, which the app writes before the run, are not checked)."""
    import os

    from rl_runtime.run.preflight import DataFiles

    made = {os.path.abspath(p) for p in generated}

    def read(files: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(f for f in files if os.path.abspath(f) not in made)

    def check(path: str) -> str | None:
        return first_rows_problem(path, plan)

    return (
        DataFiles("actor_train.data_args.file_name", read(plan.train_files), check),
        DataFiles(plan.val_files_key, read(plan.val_files), check),
    )


def load_prompts(
    files: Sequence[str], plan: DataPlan, rewards: RewardRouterSpec
) -> tuple[list[TaskRow], list[str]]:
    """All valid rows of `files` (each with its reward domain) and one line per rejected row
    (`file: row N: field: why`). A missing file, or no usable row, is an error naming it."""
    keys = RowKeys(
        prompt=plan.prompt_key or "prompt",
        messages=plan.messages_key,
        tag=plan.tag_key,
        response=plan.response_key,
    )
    spec = DataSpec(
        files=tuple(files),
        keys=keys,
        tag_to_domain=rewards.tag_to_domain(),
        default_domain=rewards.default_domain,
        default_data_source=UNNAMED_DATA_SOURCE,
        on_bad_row="skip",
    )
    data = load_dataset(spec)
    return data.rows, [str(e) for e in data.rejected]


@dataclass
class PromptSet:
    """Rows whose prompt fits `prompt_length` (or was cut to it), each row's `index` its position
    here, and their prompt token ids; what was left out or changed: rejected rows (one line
    each), overlong prompts dropped, overlong prompts truncated."""

    rows: list[TaskRow]
    ids: list[list[int]]
    rejected: list[str]
    overlong: int
    truncated: int = 0

    def head(self, n: int | None) -> PromptSet:
        """The first `n` prompts (all when None)."""
        return replace(self, rows=self.rows[:n], ids=self.ids[:n])


TRUNCATIONS = ("drop", "left", "right", "middle")


def truncate_prompt(ids: list[int], limit: int, how: str) -> list[int]:
    """`ids` cut to `limit` tokens as verl's `data.truncation` cuts them: "left" keeps the last
    `limit`, "right" the first `limit`, "middle" the first `limit // 2` and the last
    `limit - limit // 2`. Shorter `ids` are returned as they are."""
    if len(ids) <= limit:
        return ids
    if how == "left":
        return ids[len(ids) - limit :]
    if how == "right":
        return ids[:limit]
    if how == "middle":
        head = limit // 2
        return ids[:head] + ids[len(ids) - (limit - head) :]
    raise ValueError(f"prompt_truncation={how!r}: one of {TRUNCATIONS[1:]} cuts a prompt")


def tokenized_prompts(
    files: Sequence[str],
    plan: DataPlan,
    rewards: RewardRouterSpec,
    tokenizer: Any,
    template: Any,
    prompt_length: int,
    truncation: str = "drop",
) -> PromptSet:
    """`load_prompts(files)` with each prompt rendered by `template` and tokenized; prompts longer
    than `prompt_length` tokens are dropped and counted (`truncation` "drop": verl's
    filter_overlong_prompts), or cut to it and counted (`truncate_prompt`). No prompt left is an
    error naming the files."""
    if truncation not in TRUNCATIONS:
        raise ValueError(f"prompt_truncation={truncation!r}: one of {TRUNCATIONS}")
    rows, rejected = load_prompts(files, plan, rewards)
    kept, ids, shortest, cut = [], [], None, 0
    for row in rows:
        tokens = list(tokenizer(template.prefix(row.prompt), add_special_tokens=False)["input_ids"])
        shortest = len(tokens) if shortest is None else min(shortest, len(tokens))
        if len(tokens) > prompt_length and truncation != "drop":
            tokens, cut = truncate_prompt(tokens, prompt_length, truncation), cut + 1
        if len(tokens) <= prompt_length:
            kept.append(replace(row, index=len(kept)))
            ids.append(tokens)
    if not kept:
        raise DataError(
            f"{list(files)}: every prompt is longer than prompt_length={prompt_length} tokens "
            f"(the shortest has {shortest}): raise prompt_length"
        )
    return PromptSet(kept, ids, rejected, len(rows) - len(kept), cut)


class RowSampler:
    """Indices into `rows` for each step, through rl_envs' resumable `PromptSampler`
    (`domain_interleave_probs` mixes reward domains per batch: `quotas` says how many rows of
    each domain a batch takes, `draw` takes them; without it there is one quota, key None)."""

    def __init__(self, rows: list[TaskRow], seed: int, probs: dict[str, float] | None) -> None:
        self.sampler = PromptSampler(rows, seed, probs)

    def next(self, k: int) -> list[int]:
        return [row.index for row in self.sampler.next_batch(k)]

    def quotas(self, k: int) -> dict[str | None, int]:
        """Rows per domain of a batch of `k` (`{None: k}` without domain mixing)."""
        if not self.sampler.probs:
            return {None: k}
        quotas: dict[str | None, int] = {}
        quotas.update(domain_quotas(self.sampler.probs, k))
        return quotas

    def key_of(self, row: TaskRow) -> str | None:
        """The quota `row` counts in: its domain (None without domain mixing)."""
        return row.domain if self.sampler.probs else None

    def draw(self, wanted: dict[str | None, int]) -> list[int]:
        """`wanted[d]` more rows of each domain d, in `wanted`'s order (the first batch's
        `quotas` draw what `next` would)."""
        return [row.index for d, k in wanted.items() for row in self.sampler.draw(k, d)]

    def state(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


@dataclass
class RlvrPrompts:
    """A run's prompts: `train` (all that fit `prompt_length`), `val` (the first `val_prompts`
    held-out ones; empty without held-out files), the resumable `sampler` over `train`, and the
    data/* metrics every step reports."""

    train: PromptSet
    val: PromptSet
    sampler: RowSampler
    metrics: dict[str, float]


def load_rlvr_prompts(plan: RlvrPlan, tokenizer: Any, seed: int) -> RlvrPrompts:
    """The training and held-out prompts of `plan.data`, each rendered by its template and
    tokenized (`tokenized_prompts`); prints the first 20 rejected training rows and the counts of
    overlong training and held-out prompts (held-out counts also in `data/val_*`). The sampler is seeded with the run's `seed`."""
    from rl_envs.tasks import require_files
    from rl_rollout.templates import get_template

    def prompts(files: tuple[str, ...], template: str) -> PromptSet:
        return tokenized_prompts(files, plan.data, plan.rewards, tokenizer,
                                 get_template(template, tokenizer), plan.prompt_length,
                                 plan.prompt_truncation)  # fmt: skip

    data = plan.data
    require_files("actor_train.data_args.file_name", data.train_files)
    train = prompts(data.train_files, data.template)
    require_files(data.val_files_key, data.val_files)
    val = (
        prompts(data.val_files, data.val_template).head(plan.val_prompts)
        if data.val_files
        else PromptSet([], [], [], 0)
    )
    metrics = {"data/train_prompts": float(len(train.rows)),
               "data/rejected_rows": float(len(train.rejected)),
               "data/filtered_overlong_prompts": float(train.overlong)}  # fmt: skip
    if data.val_files:  # an evaluation of the short held-out prompts only says so
        metrics.update({"data/val_rejected_rows": float(len(val.rejected)),
                        "data/val_filtered_overlong_prompts": float(val.overlong)})  # fmt: skip
    if plan.prompt_truncation != "drop":  # prompts cut to prompt_length (none are dropped)
        metrics["data/truncated_prompts"] = float(train.truncated)
        if data.val_files:
            metrics["data/val_truncated_prompts"] = float(val.truncated)
    for line in train.rejected[:20]:
        print(f"warning: rejected {line}", flush=True)
    for overlong, which in ((train.overlong, ""), (val.overlong, "held-out ")):
        if overlong:
            print(f"filtered {overlong} {which}prompts longer than "
                  f"prompt_length={plan.prompt_length}")  # fmt: skip
    for cut, which in ((train.truncated, ""), (val.truncated, "held-out ")):
        if cut:
            print(f"truncated {cut} {which}prompts to prompt_length={plan.prompt_length} "
                  f"tokens (prompt_truncation={plan.prompt_truncation})")  # fmt: skip
    sampler = RowSampler(train.rows, seed, data.domain_interleave_probs)
    return RlvrPrompts(train, val, sampler, metrics)
