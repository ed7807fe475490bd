"""The env protocol and the shared turn logic of text games.

Every env speaks ``reset(seed) -> (observation, info)`` and
``step(action_text) -> (observation, reward, terminated, truncated, info)`` where ``action_text``
is the model's whole response for the turn. ``info`` from ``step`` always carries
``action_is_valid``, ``format_ok`` and ``success``.
"""

from __future__ import annotations

import os
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rl_envs.content_split import check_split_options, content_split
from rl_envs.parsing import ParsedAction, compile_pattern, parse_action
from rl_envs.prompts import (
    ANSWER_TURN_TEMPLATE,
    DEFAULT_SYSTEM_PROMPT,
    THINK_TURN_TEMPLATE,
    format_turn,
    validate_template,
)

StepResult = tuple[str, float, bool, bool, dict[str, Any]]


@runtime_checkable
class Env(Protocol):
    """What the agent loop and env groups rely on."""

    max_steps: int
    format_penalty: float

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]: ...

    def step(self, action_text: str) -> StepResult: ...

    def render(self, mode: str = "text") -> Any: ...

    def system_prompt(self) -> str: ...

    def instruction(self) -> str: ...

    def turn_prompt(self, observation: str, turn_idx: int, max_response_length: int) -> str: ...

    def close(self) -> None: ...


def random_seed() -> int:
    """A fresh seed when ``reset`` is called without one."""
    return int(np.random.default_rng().integers(2**31))


class EpisodeOverError(RuntimeError):
    """``step`` was called after the episode terminated or was truncated."""


class TextGameEnv:
    """Shared logic of multi-turn text games: parsing, format penalty, step limit, prompts, frames.

    Subclasses set ``action_names`` and implement ``_reset_game(rng)``, ``_apply(action_name) ->
    (reward, terminated, success, effective)``, ``_render_text()`` and ``_render_rgb()``; those
    that implement ``content_key()`` can be split by content: with ``layout_split`` ("train" or
    "val") ``reset`` redraws (from the same seeded stream) until the instance's content hash falls
    in that split, a ``val_fraction`` share of all instances being "val" (rl_envs.content_split).
    """

    #: redraws ``reset`` may take to land in ``layout_split`` before it gives up
    max_split_draws: int = 10_000
    #: constructor options that set the prompts (rl_envs.registry.prompt_options)
    prompt_options: tuple[str, ...] = ("system_prompt", "turn_template")

    action_names: tuple[str, ...] = ()
    default_instruction: str = ""

    def __init__(
        self,
        *,
        max_steps: int = 100,
        format_penalty: float = 0.0,
        action_pattern: str = "answer",
        action_sep: str = "||",
        max_actions_per_step: int = 1,
        env_instruction: str | None = None,
        system_prompt: str | None = None,
        turn_template: str | None = None,
        render_save_dir: str | None = None,
        layout_split: str | None = None,
        val_fraction: float = 0.5,
    ) -> None:
        check_split_options(layout_split, val_fraction)
        if layout_split is not None and type(self).content_key is TextGameEnv.content_key:
            raise ValueError(f"layout_split: {type(self).__name__} has no content_key()")
        self.layout_split = layout_split
        self.val_fraction = float(val_fraction)
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if max_actions_per_step < 1:
            raise ValueError(f"max_actions_per_step must be >= 1, got {max_actions_per_step}")
        self.max_steps = int(max_steps)
        self.format_penalty = float(format_penalty)
        self.action_pattern = action_pattern
        self._pattern = compile_pattern(action_pattern)
        self.action_sep = action_sep
        self.max_actions_per_step = int(max_actions_per_step)
        self.env_instruction = env_instruction
        self._system_prompt = system_prompt or DEFAULT_SYSTEM_PROMPT
        thinks = self._pattern.groups >= 2
        self.turn_template = turn_template or (
            THINK_TURN_TEMPLATE if thinks else ANSWER_TURN_TEMPLATE
        )
        validate_template(self.turn_template)
        self.render_save_dir = render_save_dir
        if render_save_dir is not None:
            from rl_envs.render import require_pillow

            require_pillow()
        self.seed: int | None = None
        self.steps_taken = 0
        self.episode_reward = 0.0
        self.done = True
        self.success = False

    # ----- protocol -------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.seed = int(seed) if seed is not None else random_seed()
        rng = np.random.default_rng(self.seed)
        self._reset_game(rng)
        draws = 1
        while self.layout_split is not None and self.split() != self.layout_split:
            if draws >= self.max_split_draws:
                raise RuntimeError(
                    f"no {self.layout_split!r} instance in {draws} draws "
                    f"(val_fraction={self.val_fraction})"
                )
            self._reset_game(rng)
            draws += 1
        self.steps_taken = 0
        self.episode_reward = 0.0
        self.done = False
        self.success = False
        self._save_frame()
        return self._render_text(), {"seed": self.seed, "actions": list(self.action_names)}

    def step(self, action_text: str) -> StepResult:
        if self.done:
            raise EpisodeOverError("step() called after the episode ended; call reset() first")
        parsed = self.parse(action_text)
        self.steps_taken += 1
        reward = 0.0
        terminated = False
        effective = False
        executed: list[str] = []
        if not parsed.action_is_valid:
            reward = self.format_penalty
        else:
            for name in parsed.actions:
                r, terminated, success, changed = self._apply(name)
                executed.append(name)
                reward += r
                effective = effective or changed
                self.success = self.success or success
                if terminated:
                    break
        truncated = (not terminated) and self.steps_taken >= self.max_steps
        self.done = terminated or truncated
        self.episode_reward += reward
        self._save_frame()
        info = {
            "action_is_valid": parsed.action_is_valid,
            "format_ok": parsed.format_ok,
            "success": self.success,
            "action_is_effective": effective,
            "actions": executed,
            "steps_taken": self.steps_taken,
            "actions_left": self.actions_left,
            "episode_reward": self.episode_reward,
        }
        return self._render_text(), float(reward), terminated, truncated, info

    def render(self, mode: str = "text") -> Any:
        if mode == "text":
            return self._render_text()
        if mode == "rgb_array":
            return self._render_rgb()
        raise ValueError(f"render mode must be 'text' or 'rgb_array', got {mode!r}")

    def system_prompt(self) -> str:
        return self._system_prompt

    def instruction(self) -> str:
        base = (
            self.env_instruction if self.env_instruction is not None else self.default_instruction
        )
        actions = ", ".join(self.action_names)
        return f"{base}\n{self._legend()}\nYour available actions are: {actions}.".strip()

    def turn_prompt(self, observation: str, turn_idx: int, max_response_length: int) -> str:
        return format_turn(
            self.turn_template,
            turn_idx=turn_idx,
            observation=observation,
            actions_left=self.actions_left,
            max_response_length=max_response_length,
        )

    def close(self) -> None:
        return None

    # ----- helpers ----------------------------------------------------------------------------
    def content_key(self) -> bytes:
        """What makes the current instance the same puzzle (held-out splits compare these)."""
        raise NotImplementedError(f"{type(self).__name__} has no content_key()")

    def split(self) -> str:
        """The split ("train"/"val") the current instance belongs to at this ``val_fraction``."""
        return content_split(self.content_key(), self.val_fraction)

    @property
    def actions_left(self) -> int:
        return max(self.max_steps - self.steps_taken, 0)

    def parse(self, action_text: str) -> ParsedAction:
        return parse_action(
            action_text,
            self._pattern,
            self.action_names,
            action_sep=self.action_sep,
            max_actions=self.max_actions_per_step,
        )

    def format_action(self, action_name: str) -> str:
        """A response text that this env parses as ``action_name`` (for expert demonstrations)."""
        if action_name not in self.action_names:
            raise ValueError(f"unknown action {action_name!r}; actions: {self.action_names}")
        if self._pattern.groups >= 2:
            return f"<think>I move {action_name}.</think><answer>{action_name}</answer>"
        return f"<answer>{action_name}</answer>"

    def _save_frame(self) -> None:
        if self.render_save_dir is None:
            return
        from rl_envs.render import save_png

        name = f"{type(self).__name__}_seed{self.seed}_step{self.steps_taken:04d}.png"
        save_png(self._render_rgb(), os.path.join(self.render_save_dir, name))

    # ----- to implement -------------------------------------------------------------------------
    def _legend(self) -> str:
        return ""

    def _reset_game(self, rng: np.random.Generator) -> None:
        raise NotImplementedError

    def _apply(self, action_name: str) -> tuple[float, bool, bool, bool]:
        raise NotImplementedError

    def _render_text(self) -> str:
        raise NotImplementedError

    def _render_rgb(self) -> np.ndarray:
        raise NotImplementedError
