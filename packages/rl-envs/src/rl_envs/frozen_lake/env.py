"""FrozenLake as a multi-turn text env (ROLL's ``frozen_lake`` env type)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from rl_envs.base import TextGameEnv
from rl_envs.frozen_lake.generator import (
    ACTION_NAMES,
    GOAL,
    HOLE,
    MOVES,
    FrozenLakeState,
    generate_frozen_lake,
    step_position,
)
from rl_envs.render import grid_to_rgb

# Observation symbols: 0 player, 1 frozen, 2 hole, 3 goal, 4 player in hole, 5 player on goal.
DEFAULT_GRID_LOOKUP: dict[int, str] = {0: "P", 1: "_", 2: "O", 3: "G", 4: "X", 5: "√"}
_MEANINGS = ("player", "frozen", "hole", "goal", "player in hole", "player on goal")
PALETTE = {
    0: (40, 80, 220),
    1: (200, 230, 250),
    2: (20, 20, 60),
    3: (60, 170, 60),
    4: (200, 40, 40),
    5: (240, 200, 40),
}
FROZEN_LAKE_INSTRUCTION = (
    "You are solving the FrozenLake puzzle. Avoid the holes and go to the goal. You may move in an "
    "unintended direction due to the slippery ice. The answer must be one of the actions, format "
    "is <answer>Right</answer>."
)
_PERPENDICULAR = {
    "Left": ("Up", "Down"),
    "Right": ("Up", "Down"),
    "Up": ("Left", "Right"),
    "Down": ("Left", "Right"),
}


class FrozenLakeEnv(TextGameEnv):
    """Walk from the start to the goal without falling into a hole.

    The start is the top-left cell and the goal the bottom-right one, or with ``random_start`` /
    ``random_goal`` a random cell each (then no fixed action sequence solves most maps: the policy
    has to read the map); ``min_path_length`` keeps only maps whose shortest path takes at least
    that many moves (no goal next to the start). ``content_key()`` is the layout with start and goal, so ``layout_split``
    (see ``TextGameEnv``) holds validation maps out by content.

    Reward 1.0 on reaching the goal (terminated, success), 0.0 otherwise; falling into a hole
    terminates without success. With ``is_slippery`` the intended move happens with probability
    ``success_rate`` and each perpendicular move with ``(1 - success_rate) / 2``.
    Unparsable responses cost ``format_penalty`` and leave the state unchanged.
    """

    action_names = ACTION_NAMES
    default_instruction = FROZEN_LAKE_INSTRUCTION

    def __init__(
        self,
        *,
        size: int = 4,
        p: float = 0.8,
        is_slippery: bool = True,
        success_rate: float = 1.0 / 3.0,
        grid_lookup: Mapping[int | str, str] | None = None,
        reward_goal: float = 1.0,
        max_steps: int = 100,
        random_start: bool = False,
        random_goal: bool = False,
        min_path_length: int = 1,
        **common: Any,
    ) -> None:
        super().__init__(max_steps=max_steps, **common)
        self.random_start = bool(random_start)
        self.random_goal = bool(random_goal)
        self.min_path_length = int(min_path_length)
        self.size = int(size)
        self.p = float(p)
        self.is_slippery = bool(is_slippery)
        if not 0.0 <= success_rate <= 1.0:
            raise ValueError(f"success_rate must be in [0, 1], got {success_rate}")
        self.success_rate = float(success_rate)
        lookup = {int(k): str(v) for k, v in (grid_lookup or DEFAULT_GRID_LOOKUP).items()}
        missing = sorted(set(range(6)) - set(lookup))
        if missing:
            raise ValueError(f"grid_lookup misses codes {missing} (needs 0..5)")
        self.grid_lookup = lookup
        self.reward_goal = float(reward_goal)
        self.state: FrozenLakeState | None = None
        self._slip_rng = np.random.default_rng(0)

    def _reset_game(self, rng: np.random.Generator) -> None:
        desc = generate_frozen_lake(
            int(rng.integers(2**31)),
            size=self.size,
            p=self.p,
            random_start=self.random_start,
            random_goal=self.random_goal,
            min_path_length=self.min_path_length,
        )
        self._slip_rng = np.random.default_rng(int(rng.integers(2**31)))
        fmt = self.format_action(ACTION_NAMES[0]).replace(ACTION_NAMES[0], "{action}")
        state = FrozenLakeState(desc=desc, player=(0, 0), answer_format=fmt)
        self.state = dataclasses.replace(state, player=state.start)

    def content_key(self) -> bytes:
        """The map (holes, start and goal cells) the episode started on."""
        assert self.state is not None, "call reset() first"
        desc = self.state.desc
        return b"frozen_lake/%dx%d/" % desc.shape + desc.astype(np.int8).tobytes()

    def set_state(self, state: FrozenLakeState) -> None:
        """Start an episode from a given map and position (tests, curricula)."""
        fmt = self.format_action(ACTION_NAMES[0]).replace(ACTION_NAMES[0], "{action}")
        self.state = dataclasses.replace(state, answer_format=fmt)
        self.steps_taken = 0
        self.episode_reward = 0.0
        self.done = bool(state.desc[state.player] in (HOLE, GOAL))
        self.success = bool(state.desc[state.player] == GOAL)

    def _apply(self, action_name: str) -> tuple[float, bool, bool, bool]:
        assert self.state is not None
        taken = action_name
        if self.is_slippery:
            u = self._slip_rng.random()
            if u >= self.success_rate:
                side = _PERPENDICULAR[action_name]
                taken = side[0] if u < self.success_rate + (1 - self.success_rate) / 2 else side[1]
        st = self.state
        nxt = step_position(st.desc, st.player, taken)
        self.state = FrozenLakeState(st.desc, nxt, st.answer_format)
        cell = st.desc[nxt]
        reached = bool(cell == GOAL)
        terminated = reached or bool(cell == HOLE)
        return (self.reward_goal if reached else 0.0), terminated, reached, nxt != st.player

    def _legend(self) -> str:
        pairs = ", ".join(f"{self.grid_lookup[i]}: {_MEANINGS[i]}" for i in range(6))
        return f"The meaning of each symbol in the state is: {pairs}"

    def _codes(self) -> np.ndarray:
        assert self.state is not None, "call reset() first"
        desc = self.state.desc
        codes = np.where(desc == HOLE, 2, np.where(desc == GOAL, 3, 1)).astype(np.int8)
        cell = desc[self.state.player]
        codes[self.state.player] = 4 if cell == HOLE else 5 if cell == GOAL else 0
        return codes

    def _render_text(self) -> str:
        return "\n".join("".join(self.grid_lookup[int(v)] for v in row) for row in self._codes())

    def _render_rgb(self) -> np.ndarray:
        return grid_to_rgb(self._codes(), PALETTE)


__all__ = ["MOVES", "FrozenLakeEnv"]
