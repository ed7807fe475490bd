"""Reward managers: score batches of responses with sandboxed reward functions.

Every call runs in a ``SandboxPool``; a function that hangs, crashes, blows a limit or returns
something that is not a finite number (or a dict with a finite ``score``) gives reward 0.0 and a
counted failure. Calls for a batch are issued concurrently across the pool's workers.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rl_envs.rewards.custom import CustomReward
from rl_envs.rewards.registry import get_reward
from rl_envs.sandbox.pool import SandboxPool


@dataclass(frozen=True)
class RewardInput:
    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: dict[str, Any] | None = None
    response_length: int | None = None  # tokens; used by the DAPO overlong penalty


@dataclass
class RewardOutput:
    reward: float
    ok: bool
    kind: str = "ok"
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def coerce_reward(value: Any) -> tuple[float | None, dict[str, Any], str]:
    """``(reward, extra, error)``: numbers and bools pass if finite; dicts need a finite
    ``score``; anything else (None, NaN, strings) is an error."""
    extra: dict[str, Any] = {}
    if isinstance(value, dict):
        extra = {k: v for k, v in value.items() if k != "score"}
        value = value.get("score")
    if isinstance(value, bool):
        return float(value), extra, ""
    if isinstance(value, int | float):
        number = float(value)
        if math.isfinite(number):
            return number, extra, ""
        return None, extra, f"reward is not finite: {number}"
    return None, extra, f"reward must be a number, got {type(value).__name__}"


class RewardManager:
    """Scores with a registered reward name (verl signature) or a ``CustomReward`` file."""

    def __init__(
        self,
        pool: SandboxPool,
        reward: str | CustomReward = "default",
        *,
        timeout_s: float | None = None,
        max_concurrency: int | None = None,
    ) -> None:
        self.pool = pool
        self.reward = reward
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency or pool.num_workers
        self._target = get_reward(reward) if isinstance(reward, str) else None
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _call(self, item: RewardInput) -> Any:
        args = (item.data_source, item.solution_str, item.ground_truth, item.extra_info or {})
        if self._target is not None:
            return self.pool.call(self._target, *args, timeout_s=self.timeout_s)
        assert isinstance(self.reward, CustomReward)
        return self.pool.call_source(
            self.reward.source,
            self.reward.function,
            args,
            filename=self.reward.path.rsplit("/", 1)[-1],
            timeout_s=self.timeout_s,
        )

    def score_one(self, item: RewardInput) -> RewardOutput:
        result = self._call(item)
        if not result.ok:
            output = RewardOutput(0.0, False, result.kind, result.error)
        else:
            reward, extra, error = coerce_reward(result.value)
            if reward is None:
                output = RewardOutput(0.0, False, "bad_result", error, extra)
            else:
                output = RewardOutput(reward, True, "ok", "", extra)
        output = self._post(item, output)
        with self._lock:
            self.stats["calls"] += 1
            if not output.ok:
                self.stats["failures"] += 1
                self.stats[f"failure.{output.kind}"] += 1
        return output

    def _post(self, item: RewardInput, output: RewardOutput) -> RewardOutput:
        return output

    def score(self, items: list[RewardInput]) -> list[RewardOutput]:
        """Scores in input order."""
        if len(items) <= 1:
            return [self.score_one(i) for i in items]
        with ThreadPoolExecutor(
            max_workers=self.max_concurrency, thread_name_prefix="reward"
        ) as ex:
            return list(ex.map(self.score_one, items))


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
    ) -> None:
        super().__init__(pool, reward, timeout_s=timeout_s, max_concurrency=max_concurrency)
        if overlong_buffer_len < 0 or overlong_buffer_len > max_resp_len:
            raise ValueError(
                f"overlong_buffer_len must be in [0, max_resp_len={max_resp_len}], got {overlong_buffer_len}"
            )
        self.max_resp_len = max_resp_len
        self.overlong_buffer_len = overlong_buffer_len
        self.overlong_penalty_factor = overlong_penalty_factor

    def overlong_penalty(self, response_length: int) -> float:
        if self.overlong_buffer_len == 0:
            return 0.0
        expected = self.max_resp_len - self.overlong_buffer_len
        exceed = min(response_length - expected, self.overlong_buffer_len)
        return min(-exceed / self.overlong_buffer_len * self.overlong_penalty_factor, 0.0)

    def _post(self, item: RewardInput, output: RewardOutput) -> RewardOutput:
        if item.response_length is None:
            return output
        penalty = self.overlong_penalty(item.response_length)
        output.extra["overlong_penalty"] = penalty
        output.reward += penalty
        return output
