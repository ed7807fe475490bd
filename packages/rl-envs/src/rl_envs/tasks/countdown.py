"""Countdown: reach a target with each given number used exactly once (+ - * /)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rl_envs.base import random_seed
from rl_envs.tasks.data import TaskRow
from rl_envs.tasks.single_turn import SingleTurnEnv

PROMPT = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number must be used exactly once. Show your work "
    "in <think> </think> tags and return the final equation in <answer> </answer> tags, for "
    "example <answer> (1 + 2) / 3 </answer>."
)


def generate_countdown(seed: int, *, num_numbers: int = 4, max_number: int = 50) -> dict[str, Any]:
    """Numbers and a target reachable by construction (combine all numbers in a random order)."""
    if num_numbers < 2:
        raise ValueError(f"num_numbers must be >= 2, got {num_numbers}")
    rng = np.random.default_rng(seed)
    while True:
        numbers = [int(n) for n in rng.integers(1, max_number + 1, size=num_numbers)]
        items: list[tuple[int, str]] = [(n, str(n)) for n in numbers]
        while len(items) > 1:
            i, j = rng.choice(len(items), size=2, replace=False)
            (a, ea), (b, eb) = items[i], items[j]
            options = [(a + b, f"({ea} + {eb})"), (a * b, f"({ea} * {eb})")]
            if a > b:
                options.append((a - b, f"({ea} - {eb})"))
            if b != 0 and a % b == 0:
                options.append((a // b, f"({ea} / {eb})"))
            value, expr = options[int(rng.integers(len(options)))]
            items = [it for k, it in enumerate(items) if k not in (i, j)] + [(value, expr)]
        target, expression = items[0]
        if 0 < target <= 10_000:
            return {"numbers": numbers, "target": target, "solution": expression}


class CountdownEnv(SingleTurnEnv):
    """Tasks generated per seed; graded by ``countdown_score`` in the sandbox."""

    def __init__(self, *, num_numbers: int = 4, max_number: int = 50, **kwargs: Any) -> None:
        self.num_numbers = num_numbers
        self.max_number = max_number
        placeholder = TaskRow(
            0, [{"role": "user", "content": "?"}], {"numbers": [], "target": 0}, "countdown"
        )
        super().__init__([placeholder], **kwargs)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        seed = int(seed) if seed is not None else random_seed()
        task = generate_countdown(seed, num_numbers=self.num_numbers, max_number=self.max_number)
        prompt = PROMPT.format(numbers=task["numbers"], target=task["target"])
        truth = {"numbers": task["numbers"], "target": task["target"]}
        self.row = TaskRow(seed, [{"role": "user", "content": prompt}], truth, "countdown",
                           {"solution": task["solution"]})  # fmt: skip
        self.done = False
        return prompt, {"row": seed, "messages": list(self.row.prompt), "data_source": "countdown"}

    def instruction(self) -> str:
        return "Return the final equation in <answer> </answer> tags."
