"""Reward managers: score batches of responses with sandboxed reward functions.

Offers: ``RewardInput`` (one response to score; ``RewardInput.from_row``), ``RewardOutput``,
``RewardManager`` (a registered reward name or a ``CustomReward`` file, verl style per response or
TRL style per batch, sync or async), ``DAPORewardManager`` (overlong penalty),
``coerce_reward``/``coerce_reward_kind``. Per-domain routing: ``rl_envs.rewards.router``.

Every call runs in a ``SandboxPool``; a function that hangs, crashes, blows a limit or returns
something that is not a finite number (or a dict with a finite ``score``) gives reward 0.0 and a
counted failure whose ``kind`` names the reason: a sandbox outcome (``exception``, ``timeout``,
``memory``, ``crashed``, ``output_too_large`` ...) or a bad value (``not_finite`` for NaN/inf,
``none``, ``bad_result``). Calls for a batch are issued concurrently across the pool's workers.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rl_envs.rewards.custom import CustomReward
from rl_envs.rewards.registry import get_reward, reads_only
from rl_envs.sandbox.pool import SandboxPool, SandboxResult

if TYPE_CHECKING:
    from rl_envs.tasks.data import TaskRow


@dataclass(frozen=True)
class RewardInput:
    """One response to score. ``prompt``: the row's prompt (messages, or text) for TRL-style
    functions; ``domain``: reward domain (``rl_envs.rewards.router``); ``columns``: the row's
    other columns (TRL ``**columns``; code rows carry ``test_cases``/``case_type`` here)."""

    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: dict[str, Any] | None = None
    response_length: int | None = None  # tokens; used by the DAPO overlong penalty
    prompt: Any = None
    domain: str | None = None
    columns: dict[str, Any] | None = None

    @classmethod
    def from_row(
        cls, row: TaskRow, solution_str: str, response_length: int | None = None
    ) -> RewardInput:
        """The input for a response to ``row`` (a ``rl_envs.tasks.TaskRow``)."""
        return cls(
            data_source=row.data_source,
            solution_str=solution_str,
            ground_truth=row.ground_truth,
            extra_info=row.extra_info,
            response_length=response_length,
            prompt=row.prompt_text,
            domain=row.domain,
            columns=row.columns,
        )


@dataclass
class RewardOutput:
    reward: float
    ok: bool
    kind: str = "ok"
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def coerce_reward_kind(value: Any) -> tuple[float | None, dict[str, Any], str, str]:
    """``(reward, extra, kind, error)``: numbers and bools pass if finite (kind ``ok``); dicts
    need a finite ``score`` (their other entries are ``extra``); NaN/inf (or an int no float
    holds) is ``not_finite``, None ``none``, anything else ``bad_result``."""
    extra: dict[str, Any] = {}
    if isinstance(value, dict):
        extra = {k: v for k, v in value.items() if k != "score"}
        if "score" not in value:
            return None, extra, "bad_result", "reward dict has no 'score'"
        value = value["score"]
    if isinstance(value, bool):
        return float(value), extra, "ok", ""
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:  # an int beyond float's range (10**400), finite only as an int
            error = "reward is not finite: an integer beyond a float's range"
            return None, extra, "not_finite", error
        if math.isfinite(number):
            return number, extra, "ok", ""
        return None, extra, "not_finite", f"reward is not finite: {number}"
    if value is None:
        return None, extra, "none", "reward is None"
    return None, extra, "bad_result", f"reward must be a number, got {type(value).__name__}"


def coerce_reward(value: Any) -> tuple[float | None, dict[str, Any], str]:
    """``(reward, extra, error)``: ``coerce_reward_kind`` without the kind."""
    reward, extra, _, error = coerce_reward_kind(value)
    return reward, extra, error


class RewardManager:
    """Scores with a registered reward name (verl signature) or a ``CustomReward`` file.

    ``options``: keyword arguments passed to every call (e.g. a format ``pattern``).
    ``timeout_s``: per call (a TRL-style batch is one call); None: the pool's limit.
    ``stats``: ``calls``, ``failures`` and ``failure.<kind>`` counts since creation.
    """

    def __init__(
        self,
        pool: SandboxPool,
        reward: str | CustomReward = "default",
        *,
        timeout_s: float | None = None,
        max_concurrency: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.pool = pool
        self.reward = reward
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency or pool.num_workers
        self.options = dict(options or {})
        self._target = get_reward(reward) if isinstance(reward, str) else None
        self._reads_only = isinstance(reward, str) and reads_only(reward)
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()

    @property
    def batched(self) -> bool:
        """True for a TRL-style function: one call per batch."""
        return isinstance(self.reward, CustomReward) and self.reward.style == "trl"

    def _kwargs(self, item: RewardInput) -> dict[str, Any]:
        return self.options

    def _timeout(self, item: RewardInput) -> float | None:
        return self.timeout_s

    def _invoke(
        self, args: list[Any], kwargs: dict[str, Any], timeout_s: float | None
    ) -> SandboxResult:
        if self._target is not None:
            return self.pool.call(self._target, *args, timeout_s=timeout_s, **kwargs)
        assert isinstance(self.reward, CustomReward)
        return self.pool.call_source(
            self.reward.source,
            self.reward.function,
            args,
            kwargs,
            filename=self.reward.path.rsplit("/", 1)[-1],
            timeout_s=timeout_s,
        )

    @staticmethod
    def _args(item: RewardInput) -> list[Any]:
        return [item.data_source, item.solution_str, item.ground_truth, item.extra_info or {}]

    def _call(self, item: RewardInput) -> SandboxResult:
        return self._invoke(self._args(item), self._kwargs(item), self._timeout(item))

    def _output(self, value: Any) -> RewardOutput:
        reward, extra, kind, error = coerce_reward_kind(value)
        if reward is None:
            return RewardOutput(0.0, False, kind, error, extra)
        return RewardOutput(reward, True, "ok", "", extra)

    def _record(self, item: RewardInput, output: RewardOutput) -> RewardOutput:
        output = self._post(item, output)
        with self._lock:
            self.stats["calls"] += 1
            if not output.ok:
                self.stats["failures"] += 1
                self.stats[f"failure.{output.kind}"] += 1
        return output

    def score_one(self, item: RewardInput) -> RewardOutput:
        if self.batched:
            return self.score([item])[0]
        return self._scored(item, self._call(item))

    def _scored(self, item: RewardInput, result: SandboxResult) -> RewardOutput:
        if not result.ok:
            output = RewardOutput(0.0, False, result.kind, result.error)
        else:
            output = self._output(result.value)
        return self._record(item, output)

    def _post(self, item: RewardInput, output: RewardOutput) -> RewardOutput:
        return output

    def score(self, items: list[RewardInput]) -> list[RewardOutput]:
        """Scores in input order."""
        if self.batched:
            return self._score_batch(items)
        if len(items) <= 1:
            return [self.score_one(i) for i in items]
        if self._reads_only:
            return self._score_chunks(items)
        with ThreadPoolExecutor(
            max_workers=self.max_concurrency, thread_name_prefix="reward"
        ) as ex:
            return list(ex.map(self.score_one, items))

    def _score_chunks(self, items: list[RewardInput]) -> list[RewardOutput]:
        """A reward that only reads the response: one sandbox call per chunk of items, one
        chunk per concurrent call (``SandboxPool.call_each``; a failed chunk is rescored item
        by item, so a failure lands on its own item)."""
        assert self._target is not None
        target = self._target
        n_chunks = min(self.max_concurrency, len(items))
        bounds = [len(items) * k // n_chunks for k in range(n_chunks + 1)]
        chunks = [items[a:b] for a, b in itertools.pairwise(bounds)]

        def run(chunk: list[RewardInput]) -> list[SandboxResult]:
            calls = [(self._args(i), self._kwargs(i)) for i in chunk]
            return self.pool.call_each(target, calls, timeout_s=self.timeout_s)

        with ThreadPoolExecutor(max_workers=n_chunks, thread_name_prefix="reward") as ex:
            results = [r for chunk_results in ex.map(run, chunks) for r in chunk_results]
        return [self._scored(i, r) for i, r in zip(items, results, strict=True)]

    def _score_batch(self, items: list[RewardInput]) -> list[RewardOutput]:
        """TRL style: ``fn(prompts, completions, **columns)`` once, returning one value per
        item; a failed call or a list of the wrong length fails every item (same kind)."""
        if not items:
            return []
        prompts, completions, columns = trl_arguments(items)
        result = self._invoke([prompts, completions], {**columns, **self.options}, self.timeout_s)
        if not result.ok:
            failed = [RewardOutput(0.0, False, result.kind, result.error) for _ in items]
        elif not isinstance(result.value, list) or len(result.value) != len(items):
            got = (
                f"a list of {len(result.value)}"
                if isinstance(result.value, list)
                else type(result.value).__name__
            )
            error = f"batched reward must return a list of {len(items)} values, got {got}"
            failed = [RewardOutput(0.0, False, "bad_result", error) for _ in items]
        else:
            failed = [self._output(v) for v in result.value]
        return [self._record(i, o) for i, o in zip(items, failed, strict=True)]


def trl_arguments(items: list[RewardInput]) -> tuple[list[Any], list[Any], dict[str, list[Any]]]:
    """``(prompts, completions, columns)`` as TRL's ``GRPOTrainer`` passes them: chat prompts
    give conversational completions (``[{"role": "assistant", "content": ...}]``), text prompts
    give strings; columns are lists over the batch (``ground_truth``, ``data_source``,
    ``extra_info`` and the rows' other columns; a column some rows lack holds None there)."""
    prompts = [i.prompt for i in items]
    completions: list[Any] = [
        [{"role": "assistant", "content": i.solution_str}]
        if isinstance(i.prompt, list)
        else i.solution_str
        for i in items
    ]
    rows = [
        {
            **(i.columns or {}),
            "ground_truth": i.ground_truth,
            "data_source": i.data_source,
            "extra_info": i.extra_info or {},
        }
        for i in items
    ]
    names = list(dict.fromkeys(k for r in rows for k in r if k not in ("prompts", "completions")))
    return prompts, completions, {k: [r.get(k) for r in rows] for k in names}


class DAPORewardManager(RewardManager):
    """DAPO's rule reward manager: the rule score plus a soft overlong penalty.

    With ``L = max_resp_len`` and buffer ``B``: responses longer than ``L - B`` tokens lose
    ``min((len - (L - B)) / B, 1) * overlong_penalty_factor``.
    """

    def __init__(
        self,
        pool: SandboxPool,
        reward: str | CustomReward = "default",
        *,
        max_resp_len: int,
        overlong_buffer_len: int = 0,
        overlong_penalty_factor: float = 1.0,
        timeout_s: float | None = None,
        max_concurrency: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            pool, reward, timeout_s=timeout_s, max_concurrency=max_concurrency, options=options
        )
        if overlong_buffer_len < 0 or overlong_buffer_len > max_resp_len:
            raise ValueError(
                f"overlong_buffer_len must be in [0, max_resp_len={max_resp_len}], got {overlong_buffer_len}"
            )
        self.max_resp_len = max_resp_len
        self.overlong_buffer_len = overlong_buffer_len
        self.overlong_penalty_factor = overlong_penalty_factor

    def overlong_penalty(self, response_length: int) -> float:
        return overlong_penalty(
            response_length,
            max_resp_len=self.max_resp_len,
            buffer_len=self.overlong_buffer_len,
            factor=self.overlong_penalty_factor,
        )

    def _post(self, item: RewardInput, output: RewardOutput) -> RewardOutput:
        if item.response_length is None:
            return output
        penalty = self.overlong_penalty(item.response_length)
        output.extra["overlong_penalty"] = penalty
        output.reward += penalty
        return output


def overlong_penalty(
    response_length: int, *, max_resp_len: int, buffer_len: int, factor: float = 1.0
) -> float:
    """DAPO's soft overlong penalty (<= 0): ``-min((len - (L - B)) / B, 1) * factor`` for
    responses longer than ``L - B`` tokens (``L = max_resp_len``, ``B = buffer_len``)."""
    if buffer_len == 0:
        return 0.0
    exceed = min(response_length - (max_resp_len - buffer_len), buffer_len)
    return min(-exceed / buffer_len * factor, 0.0)
