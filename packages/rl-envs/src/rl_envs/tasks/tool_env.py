"""A multi-turn env where the model calls tools through JSON tool calls.

Each turn the model either calls a tool::

    <tool_call>{"name": "calculator", "arguments": {"expression": "12 * (3 + 4)"}}</tool_call>

and receives ``<tool_response>...</tool_response>``, or answers with ``<answer>...</answer>``.
Tools: ``calculator`` (safe AST arithmetic, never eval) and ``python`` (model-written code in the
sandbox, stdout returned). Every tool call has a timeout. Reward: ``correct_reward`` for a right
final answer (graded in the sandbox), ``format_penalty`` for a malformed turn or unknown tool.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from rl_envs import arith
from rl_envs.base import random_seed
from rl_envs.rewards.registry import grader_target
from rl_envs.sandbox.counting import CountingPool
from rl_envs.sandbox.pool import SandboxPool
from rl_envs.tasks.data import TaskRow

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
MAX_TOOL_OUTPUT_CHARS = 2000

TOOLS_DESCRIPTION = (
    'You can call tools by writing <tool_call>{"name": NAME, "arguments": {...}}</tool_call>.\n'
    "Tools:\n"
    '- calculator: {"expression": str} evaluates arithmetic (+ - * / // % ** and parentheses).\n'
    '- python: {"code": str} runs Python code and returns what it prints.\n'
    "When you know the result, reply with <answer>RESULT</answer>."
)


def generate_arithmetic_task(seed: int) -> TaskRow:
    rng = np.random.default_rng(seed)
    a, b, c = (int(x) for x in rng.integers(100, 10_000, size=3))
    question = f"What is {a} * {b} - {c}?"
    return TaskRow(seed, [{"role": "user", "content": question}], str(a * b - c), "tool_arithmetic")


class ToolEnv:
    """Multi-turn tool use over given rows or generated arithmetic questions."""

    def __init__(
        self,
        rows: list[TaskRow] | None = None,
        *,
        pool: SandboxPool | None = None,
        max_steps: int = 5,
        tool_timeout_s: float = 5.0,
        grade_timeout_s: float = 10.0,
        correct_reward: float = 1.0,
        format_penalty: float = -0.1,
        tools: tuple[str, ...] = ("calculator", "python"),
    ) -> None:
        unknown = sorted(set(tools) - {"calculator", "python"})
        if unknown:
            raise ValueError(f"unknown tools {unknown}; available: calculator, python")
        self.rows = rows
        self._pool = pool
        self._handle: CountingPool | None = None
        self.max_steps = max_steps
        self.tool_timeout_s = tool_timeout_s
        self.grade_timeout_s = grade_timeout_s
        self.correct_reward = correct_reward
        self.format_penalty = float(format_penalty)
        self.tools = tools
        self.row: TaskRow | None = None
        self.steps_taken = 0
        self.done = True
        self.tool_stats = {"calls": 0, "errors": 0, "timeouts": 0}

    @property
    def pool(self) -> CountingPool:
        """This env's handle on its sandbox pool (the given one, else the process-wide grading
        pool): its ``stats()`` count this env's calls only (rl_envs.sandbox.counting)."""
        if self._handle is None:
            self._handle = CountingPool.of(self._pool)
        return self._handle

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        seed = int(seed) if seed is not None else random_seed()
        self.row = self.rows[seed % len(self.rows)] if self.rows else generate_arithmetic_task(seed)
        self.steps_taken = 0
        self.done = False
        return self.row.question, {"row": self.row.index, "tools": list(self.tools)}

    def _run_tool(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Tool output and whether it succeeded."""
        self.tool_stats["calls"] += 1
        if name == "calculator":
            expression = arguments.get("expression")
            if not isinstance(expression, str):
                return "error: calculator needs a string 'expression'", False
            try:
                return str(arith.evaluate(expression)), True
            except ValueError as exc:
                return f"error: {exc}", False
        code = arguments.get("code")
        if not isinstance(code, str):
            return "error: python needs a string 'code'", False
        result = self.pool.run_python(code, timeout_s=self.tool_timeout_s)
        if result.kind == "timeout":
            self.tool_stats["timeouts"] += 1
        if not result.ok:
            return f"error ({result.kind}): {result.error}\n{result.stdout}"[
                :MAX_TOOL_OUTPUT_CHARS
            ], False
        return result.stdout[:MAX_TOOL_OUTPUT_CHARS], True

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.done or self.row is None:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        self.steps_taken += 1
        info: dict[str, Any] = {"format_ok": True, "action_is_valid": True, "success": False,
                                "tool_call": None}  # fmt: skip
        answer = ANSWER_RE.search(action_text)
        call = TOOL_CALL_RE.search(action_text)
        reward = 0.0
        terminated = False
        observation = ""
        if answer is not None and (call is None or answer.start() < call.start()):
            graded = self.pool.call(grader_target("answer"), answer.group(1).strip(),
                                    self.row.ground_truth, timeout_s=self.grade_timeout_s)  # fmt: skip
            correct = graded.ok and graded.value == 1.0
            reward = self.correct_reward if correct else 0.0
            info["success"] = bool(correct)
            info["reward_failed"] = not graded.ok
            terminated = True
        elif call is not None:
            parsed = self._parse_call(call.group(1))
            if isinstance(parsed, str):
                info.update(format_ok=False, action_is_valid=False)
                reward = self.format_penalty
                observation = f"<tool_response>error: {parsed}</tool_response>"
            else:
                name, arguments = parsed
                output, ok = self._run_tool(name, arguments)
                if not ok:
                    self.tool_stats["errors"] += 1
                info["tool_call"] = {"name": name, "ok": ok}
                observation = f"<tool_response>{json.dumps({'name': name, 'content': output})}</tool_response>"
        else:
            info.update(format_ok=False, action_is_valid=False)
            reward = self.format_penalty
            observation = "Reply with a <tool_call> or an <answer>."
        truncated = not terminated and self.steps_taken >= self.max_steps
        self.done = terminated or truncated
        return observation, float(reward), terminated, truncated, info

    def _parse_call(self, body: str) -> tuple[str, dict[str, Any]] | str:
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            return f"tool call is not valid JSON ({exc.msg})"
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return "tool call needs a string 'name'"
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return "tool call 'arguments' is not a JSON object"
        if not isinstance(arguments, dict):
            return "tool call 'arguments' must be an object"
        if data["name"] not in self.tools:
            return f"unknown tool {data['name']!r}; available: {list(self.tools)}"
        return data["name"], arguments

    def render(self, mode: str = "text") -> Any:
        if mode != "text":
            raise ValueError("the tool env renders as text only")
        return self.row.question if self.row else ""

    def system_prompt(self) -> str:
        return "You are a helpful assistant that uses tools to compute exact answers."

    def instruction(self) -> str:
        return TOOLS_DESCRIPTION

    def turn_prompt(self, observation: str, turn_idx: int, max_response_length: int) -> str:
        return observation

    def close(self) -> None:
        return None
