"""FrozenLake: random maps with a guaranteed path, BFS solver and text env."""

from rl_envs.frozen_lake.env import DEFAULT_GRID_LOOKUP, FrozenLakeEnv
from rl_envs.frozen_lake.generator import (
    ACTION_NAMES,
    FrozenLakeState,
    generate_frozen_lake,
    has_path,
)
from rl_envs.frozen_lake.solver import solve_frozen_lake

__all__ = [
    "ACTION_NAMES",
    "DEFAULT_GRID_LOOKUP",
    "FrozenLakeEnv",
    "FrozenLakeState",
    "generate_frozen_lake",
    "has_path",
    "solve_frozen_lake",
]
