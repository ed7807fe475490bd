"""Sokoban as a multi-turn text env (ROLL's ``sokoban`` env type)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from rl_envs.base import TextGameEnv
from rl_envs.render import grid_to_rgb
from rl_envs.sokoban.generator import generate_sokoban
from rl_envs.sokoban.state import ACTION_NAMES, TARGET, SokobanState, move

DEFAULT_GRID_LOOKUP: dict[int, str] = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}
DEFAULT_GRID_VOCAB: dict[str, str] = {
    "#": "wall",
    "_": "empty",
    "O": "target",
    "√": "box on target",
    "X": "box",
    "P": "player",
    "S": "player on target",
}
PALETTE = {
    0: (60, 60, 60),
    1: (230, 230, 230),
    2: (240, 180, 180),
    3: (60, 170, 60),
    4: (170, 110, 40),
    5: (40, 80, 220),
    6: (120, 60, 200),
}
SOKOBAN_INSTRUCTION = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to "
    "targets. When you are right next to a box, you can push it by moving in the same direction. "
    "You cannot push a box through a wall, and you cannot pull a box. The answer must be one of "
    "the actions, format is <answer>Right</answer>."
)


class SokobanEnv(TextGameEnv):
    """Push every box onto a target.

    Rewards per step (gym-sokoban / ROLL): ``penalty_for_step`` (-0.1) for every parsed action,
    ``reward_box_on_target`` (+1) when a box is pushed onto a target, ``penalty_box_off_target``
    (-1) when pushed off one, ``reward_finished`` (+10) when all boxes are on targets (terminated,
    success). An unparsable response or unknown action costs ``format_penalty`` and leaves the state
    unchanged; every call to ``step`` uses one of ``max_steps``.
    """

    action_names = ACTION_NAMES
    default_instruction = SOKOBAN_INSTRUCTION

    def __init__(
        self,
        *,
        dim_room: tuple[int, int] | list[int] = (6, 6),
        dim_x: int | None = None,
        dim_y: int | None = None,
        num_boxes: int = 1,
        search_depth: int = 30,
        grid_lookup: Mapping[int | str, str] | None = None,
        grid_vocab: Mapping[str, str] | None = None,
        penalty_for_step: float = -0.1,
        reward_box_on_target: float = 1.0,
        penalty_box_off_target: float = -1.0,
        reward_finished: float = 10.0,
        max_steps: int = 100,
        **common: Any,
    ) -> None:
        super().__init__(max_steps=max_steps, **common)
        rows, cols = (int(dim_room[0]), int(dim_room[1]))
        self.dim_room = (dim_x if dim_x is not None else rows, dim_y if dim_y is not None else cols)
        self.num_boxes = int(num_boxes)
        self.search_depth = int(search_depth)
        lookup = {int(k): str(v) for k, v in (grid_lookup or DEFAULT_GRID_LOOKUP).items()}
        missing = sorted(set(range(7)) - set(lookup))
        if missing:
            raise ValueError(f"grid_lookup misses codes {missing} (needs 0..6)")
        self.grid_lookup = lookup
        self.grid_vocab = dict(grid_vocab) if grid_vocab is not None else None
        self.penalty_for_step = float(penalty_for_step)
        self.reward_box_on_target = float(reward_box_on_target)
        self.penalty_box_off_target = float(penalty_box_off_target)
        self.reward_finished = float(reward_finished)
        self.state: SokobanState | None = None
        self._start_key = b""

    def _reset_game(self, rng: np.random.Generator) -> None:
        level_seed = int(rng.integers(2**31))
        level = generate_sokoban(
            level_seed,
            dim_room=self.dim_room,
            num_boxes=self.num_boxes,
            search_depth=self.search_depth,
        )
        self.state = SokobanState(
            fixed=level.fixed,
            boxes=level.boxes,
            player=level.player,
            answer_format=self._answer_format(),
        )
        self._start_key = _state_key(self.state)

    def content_key(self) -> bytes:
        """The room, boxes and player the episode started from."""
        assert self.state is not None, "call reset() first"
        return self._start_key

    def _answer_format(self) -> str:
        return self.format_action(ACTION_NAMES[0]).replace(ACTION_NAMES[0], "{action}")

    def set_state(self, state: SokobanState) -> None:
        """Start an episode from a given position (tests, curricula)."""
        self.state = dataclasses.replace(state, answer_format=self._answer_format())
        self._start_key = _state_key(self.state)
        self.steps_taken = 0
        self.episode_reward = 0.0
        self.done = state.is_solved()
        self.success = self.done

    def _apply(self, action_name: str) -> tuple[float, bool, bool, bool]:
        assert self.state is not None
        st = self.state
        outcome = move(st.fixed, st.boxes, st.player, action_name)
        reward = self.penalty_for_step
        reward += self.reward_box_on_target * outcome.pushed_onto_target
        reward += self.penalty_box_off_target * outcome.pushed_off_target
        self.state = SokobanState(st.fixed, outcome.boxes, outcome.player, st.answer_format)
        solved = all(st.fixed[b] == TARGET for b in outcome.boxes)
        if solved:
            reward += self.reward_finished
        return reward, solved, solved, outcome.moved

    def _legend(self) -> str:
        vocab = self.grid_vocab
        if vocab is None:
            names = (
                "wall",
                "empty",
                "target",
                "box on target",
                "box",
                "player",
                "player on target",
            )
            vocab = {self.grid_lookup[i]: names[i] for i in range(7)}
        pairs = ", ".join(f"{symbol}: {meaning}" for symbol, meaning in vocab.items())
        return f"The meaning of each symbol in the state is: {pairs}"

    def _render_text(self) -> str:
        assert self.state is not None, "call reset() first"
        codes = self.state.room_codes()
        return "\n".join("".join(self.grid_lookup[int(v)] for v in row) for row in codes)

    def _render_rgb(self) -> np.ndarray:
        assert self.state is not None, "call reset() first"
        return grid_to_rgb(self.state.room_codes(), PALETTE)


def _state_key(state: SokobanState) -> bytes:
    boxes = ";".join(f"{r},{c}" for r, c in sorted(state.boxes))
    head = f"sokoban/{state.fixed.shape}/{boxes}/{state.player}/".encode()
    return head + state.fixed.astype(np.int8).tobytes()
