"""Expert demonstrations: ``solve(env_state) -> list[action_text]`` for the grid games.

The texts are responses the env parses (``<answer>Up</answer>`` or the think variant), so a
runtime can turn a solved episode into SFT warm-up data.
"""

from __future__ import annotations

from typing import Any

from rl_envs.frozen_lake.generator import FrozenLakeState
from rl_envs.frozen_lake.solver import solve_frozen_lake
from rl_envs.sokoban.solver import solve_sokoban
from rl_envs.sokoban.state import SokobanState


class UnsolvableError(ValueError):
    """The state has no solution."""


def solve_actions(env_state: Any) -> list[str]:
    """Shortest list of action NAMES solving a Sokoban or FrozenLake state (or an env's state)."""
    state = getattr(env_state, "state", env_state)
    if isinstance(state, SokobanState):
        path = solve_sokoban(state)
    elif isinstance(state, FrozenLakeState):
        path = solve_frozen_lake(state)
    else:
        raise TypeError(f"no solver for {type(state).__name__}")
    if path is None:
        raise UnsolvableError(f"{type(state).__name__} has no solution")
    return path


def solve(env_state: Any) -> list[str]:
    """Shortest solution as response texts the env accepts, one per turn."""
    state = getattr(env_state, "state", env_state)
    fmt = state.answer_format
    return [fmt.format(action=name) for name in solve_actions(state)]
