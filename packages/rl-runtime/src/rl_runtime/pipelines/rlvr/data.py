"""The recipe's one door to rl_envs: prompt rows, the resumable sampler, sandboxed rewards.

Rows come from `rl_envs.tasks.dataset` (verl's parquet schema, ROLL's jsonl with the columns
`data_args` names; malformed rows are reported by file, row and field and skipped), each with its
reward domain from the `rewards` section (`RewardRouterSpec`). `load_rlvr_prompts`
gives a run's tokenized training and held-out prompts, its data/* metrics and its sampler. Sampling is
`rl_envs.tasks.sampler.PromptSampler` (ROLL's `domain_interleave_probs`, resumable). Rewards go
through `rl_envs.rewards.router.RewardRouter` in a sandbox pool (per-domain reward functions,
`custom_reward_function`), then DAPO's overlong penalty when enabled.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rl_envs.rewards.extras import EXTRA_SKIP_REASONS, ExtraNames, numeric_extras
from rl_envs.rewards.manager import RewardInput, overlong_penalty
from rl_envs.rewards.router import RewardRouter, RewardRouterSpec, make_reward_pool
from rl_envs.tasks.data import RowKeys, TaskRow
from rl_envs.tasks.dataset import DataError, DataSpec, load_dataset
from rl_envs.tasks.sampler import PromptSampler, domain_quotas
from rl_runtime.pipelines.rlvr.compose import DataPlan, OverlongPlan, RlvrPlan

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


@dataclass
class Scored:
    """One response's reward record: `reward` (the reward function's score plus the overlong
    `penalty`, <= 0, when DAPO's penalty is on), whether the call succeeded (`ok`, else its
    failure `kind`); `extras`: the numeric entries a succeeded call returned besides its score
    (verl's reward_extra_info, rl_envs.rewards.extras), `extras_skipped`: its entries left out,
    by reason."""

    reward: float
    ok: bool
    kind: str
    penalty: float = 0.0
    extras: dict[str, float] = field(default_factory=dict)
    extras_skipped: dict[str, int] = field(default_factory=dict)

    @property
    def score(self) -> float:
        """The reward function's own score: `reward` before the overlong penalty, which shapes
        the reward, not the answer's correctness nor how hard the prompt is."""
        return self.reward - self.penalty

    @property
    def correct(self) -> bool:
        """Solved: the call succeeded and the reward function scored it 1 or more (`score`: a
        right answer near the length limit is still right)."""
        return self.ok and self.score >= 1.0


class Scorer:
    """Rewards by domain in the sandbox, DAPO's overlong penalty added when enabled; a failed
    call scores 0.0 and says so (`Scored.ok`, its `kind`: never silently zero; the callers count
    them, rl_runtime.pipelines.rlvr.metrics.count_failures). Model domains (a judge, a reward model) are
    scored by `model_scorers` (rl_runtime.step.model_rewards). Thread-safe: asynchronous training scores
    rollout batches (producer thread) while evaluating."""

    def __init__(
        self,
        rewards: RewardRouterSpec,
        overlong: OverlongPlan,
        response_length: int,
        *,
        allow_weak_isolation: bool,
        model_scorers: Mapping[str, Any] | None = None,
    ) -> None:
        self.pool = make_reward_pool(2, allow_weak_isolation=allow_weak_isolation)
        try:
            self.router = RewardRouter(rewards, pool=self.pool, model_scorers=model_scorers)
        except BaseException:
            self.pool.close()
            raise
        self.overlong, self.response_length = overlong, response_length
        self._lock = threading.Lock()
        self._reported: set[tuple[str | None, str]] = set()  # (domain, kind) printed once
        self._reported_extras: set[tuple[str | None, str]] = set()  # (domain, skip reason)
        self._extra_names = ExtraNames()  # the run's extra names, bounded

    def score(
        self, rows: Sequence[TaskRow], texts: Sequence[str], lengths: Sequence[int]
    ) -> list[Scored]:
        """One `Scored` per response, in order; a succeeded call's extras checked
        (`numeric_extras`: a malformed extras dict loses its extras, never its score) and
        their names bounded over the run (`ExtraNames`: a reward that makes up new names
        cannot add metrics to every step's row)."""
        items = [
            RewardInput.from_row(r, t, response_length=n)
            for r, t, n in zip(rows, texts, lengths, strict=True)
        ]
        with self._lock:
            outputs = self.router.score(items)
            self._report_first_failures(items, outputs)
        scored = []
        for item, out in zip(items, outputs, strict=True):
            penalty = 0.0
            if self.overlong.enable:
                penalty = overlong_penalty(
                    item.response_length or 0,
                    max_resp_len=self.response_length,
                    buffer_len=self.overlong.buffer_length,
                    factor=self.overlong.penalty_factor,
                )
            extras = None
            if out.ok:
                with self._lock:  # the names and the reported set are shared between threads
                    extras = self._extra_names.admit(numeric_extras(out.extra))
                    self._report_skipped_extras(item.domain, extras.skipped)
            scored.append(Scored(out.reward + penalty, out.ok, out.kind, penalty,
                                 extras.values if extras else {},
                                 extras.skipped if extras else {}))  # fmt: skip
        return scored

    def _report_skipped_extras(self, domain: str | None, skipped: dict[str, int]) -> None:
        """Print the first skip of each (domain, reason): a reward's extra that never shows
        up as a metric would otherwise be a mystery. Not for text and other non-numbers
        (`not_number`, only counted): returning them is normal (verl's DAPO rule returns the
        predicted answer as `pred`), not a mistake to report on every run."""
        for reason in skipped:
            if reason == "not_number" or (domain, reason) in self._reported_extras:
                continue
            self._reported_extras.add((domain, reason))
            print(f"warning: reward extras skipped ({reason}, domain {domain}): "
                  f"{EXTRA_SKIP_REASONS[reason]}; further such skips are only counted "
                  f"(reward/extra_skipped/{reason})", flush=True)  # fmt: skip

    def _report_first_failures(self, items: Sequence[RewardInput], outputs: Sequence[Any]) -> None:
        """Print the first failed call of each (domain, kind) with its error: the metrics only
        count them (`reward/failures/<kind>`), and a reward function that raises on every
        response would otherwise train on with no word of why."""
        for item, out in zip(items, outputs, strict=True):
            key = (item.domain, out.kind)
            if out.ok or key in self._reported:
                continue
            self._reported.add(key)
            print(f"warning: reward call failed ({out.kind}, domain {item.domain}): "
                  f"{out.error or 'no message'}; further such failures are only counted "
                  f"(reward/failures/{out.kind})", flush=True)  # fmt: skip

    def close(self) -> None:
        self.pool.close()
