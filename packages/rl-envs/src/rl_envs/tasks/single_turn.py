"""Single-turn tasks (GSM8K, MATH, Countdown) through the Env protocol.

``reset(seed)`` picks a task, ``step(response)`` grades it in the sandbox and terminates.
"""

from __future__ import annotations

import random
from typing import Any

from rl_envs.parsing import has_answer_tag
from rl_envs.rewards.extraction import extract_boxed, extract_hash_answer
from rl_envs.rewards.manager import coerce_reward
from rl_envs.rewards.registry import get_reward
from rl_envs.sandbox.counting import CountingPool
from rl_envs.sandbox.pool import SandboxPool
from rl_envs.tasks.data import TaskRow, load_rows

SYSTEM_PROMPT = "You are a helpful assistant. Solve the problem step by step."


class SingleTurnEnv:
    """One prompt, one response, one sandboxed reward. ``success`` = reward >= ``success_reward``."""

    #: constructor options that set the prompts (rl_envs.registry.prompt_options); the user
    #: message is the row's prompt, so there is no per-turn template
    prompt_options: tuple[str, ...] = ("system_prompt",)

    def __init__(
        self,
        rows: list[TaskRow] | None = None,
        *,
        path: str | None = None,
        reward: str = "default",
        pool: SandboxPool | None = None,
        timeout_s: float | None = None,
        success_reward: float = 1.0,
        format_penalty: float = 0.0,
        system_prompt: str = SYSTEM_PROMPT,
        max_steps: int = 1,
        **load_options: Any,
    ) -> None:
        if rows is None:
            if path is None:
                raise ValueError("SingleTurnEnv needs rows or path")
            report = load_rows(path, **load_options)
            rows = report.rows
            self.load_report = report
        elif load_options:  # they only read `path`: given rows, they would do nothing
            raise TypeError(
                f"{type(self).__name__}.__init__() got an unexpected keyword argument "
                f"{sorted(load_options)[0]!r} (row-loading options apply only with path)"
            )
        if not rows:
            raise ValueError("SingleTurnEnv has no valid rows")
        self.rows = rows
        self.max_steps = max_steps
        self.format_penalty = float(format_penalty)
        self._target = get_reward(reward)
        self._pool = pool
        self._handle: CountingPool | None = None
        self.timeout_s = timeout_s
        self.success_reward = success_reward
        self._system_prompt = system_prompt
        self.row: TaskRow | None = None
        self.done = True

    @property
    def pool(self) -> CountingPool:
        """This env's handle on its sandbox pool (the given one, else the process-wide grading
        pool): its ``stats()`` count this env's calls only (rl_envs.sandbox.counting)."""
        if self._handle is None:
            self._handle = CountingPool.of(self._pool)
        return self._handle

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        index = (seed if seed is not None else random.randrange(len(self.rows))) % len(self.rows)
        self.row = self.rows[index]
        self.done = False
        return self.row.question, {"row": self.row.index, "messages": list(self.row.prompt),
                                   "data_source": self.row.data_source}  # fmt: skip

    def _format_ok(self, response: str) -> bool:
        return (
            extract_boxed(response) is not None
            or extract_hash_answer(response) is not None
            or has_answer_tag(response)
        )

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.done or self.row is None:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        row = self.row
        result = self.pool.call(
            self._target, row.data_source, action_text, row.ground_truth, row.extra_info,
            timeout_s=self.timeout_s,
        )  # fmt: skip
        reward, extra, error = (
            coerce_reward(result.value) if result.ok else (None, {}, result.error)
        )
        failed = reward is None
        value = 0.0 if reward is None else reward
        format_ok = self._format_ok(action_text)
        if not format_ok:
            value += self.format_penalty
        self.done = True
        info = {
            "format_ok": format_ok,
            "action_is_valid": format_ok,
            "success": (not failed) and value >= self.success_reward,
            "reward_failed": failed,
            "reward_error": error,
            "reward_extra": extra,
        }
        return "", float(value), True, False, info

    def render(self, mode: str = "text") -> Any:
        if mode != "text":
            raise ValueError("single-turn tasks render as text only")
        return self.row.question if self.row else ""

    def system_prompt(self) -> str:
        return self._system_prompt

    def instruction(self) -> str:
        return "Put your final answer within \\boxed{} (or after ####)."

    def turn_prompt(self, observation: str, turn_idx: int, max_response_length: int) -> str:
        return observation

    def close(self) -> None:
        return None
