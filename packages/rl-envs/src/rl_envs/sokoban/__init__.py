"""Sokoban: generator (solvable by construction), BFS solver and text env."""

from rl_envs.sokoban.env import DEFAULT_GRID_LOOKUP, DEFAULT_GRID_VOCAB, SokobanEnv
from rl_envs.sokoban.generator import GenerationError, generate_sokoban
from rl_envs.sokoban.solver import solve_sokoban
from rl_envs.sokoban.state import ACTION_NAMES, SokobanState, parse_level

__all__ = [
    "ACTION_NAMES",
    "DEFAULT_GRID_LOOKUP",
    "DEFAULT_GRID_VOCAB",
    "GenerationError",
    "SokobanEnv",
    "SokobanState",
    "generate_sokoban",
    "parse_level",
    "solve_sokoban",
]
