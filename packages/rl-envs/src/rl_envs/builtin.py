"""Built-in env types and the five ROLL tags (imported once by the registry)."""

from __future__ import annotations

from rl_envs.frozen_lake.env import FrozenLakeEnv
from rl_envs.registry import register_env, register_tag
from rl_envs.sokoban.env import SokobanEnv

register_env("sokoban", SokobanEnv)
register_env("frozen_lake", FrozenLakeEnv)

# ROLL's agentic examples: max_actions_per_traj 10, max_tokens_per_step 128.
TAG_MAX_STEPS = 10
TAG_MAX_TOKENS_PER_STEP = 128

DIFFERENT_GRID_LOOKUP = {0: "W", 1: "A", 2: "B", 3: "C", 4: "D", 5: "E", 6: "F"}
DIFFERENT_GRID_VOCAB = {
    "W": "wall",
    "A": "empty",
    "B": "target",
    "C": "box on target",
    "D": "box",
    "E": "player",
    "F": "player on target",
}

register_tag(
    "SimpleSokoban",
    "sokoban",
    {"dim_room": (6, 6), "num_boxes": 1, "search_depth": 30, "max_steps": TAG_MAX_STEPS},
    max_tokens_per_step=TAG_MAX_TOKENS_PER_STEP,
)
register_tag(
    "LargerSokoban",
    "sokoban",
    {"dim_room": (8, 8), "num_boxes": 2, "search_depth": 10, "max_steps": TAG_MAX_STEPS},
    max_tokens_per_step=TAG_MAX_TOKENS_PER_STEP,
)
register_tag(
    "SokobanDifferentGridVocab",
    "sokoban",
    {
        "dim_room": (6, 6),
        "num_boxes": 1,
        "search_depth": 30,
        "max_steps": TAG_MAX_STEPS,
        "grid_lookup": DIFFERENT_GRID_LOOKUP,
        "grid_vocab": DIFFERENT_GRID_VOCAB,
    },
    max_tokens_per_step=TAG_MAX_TOKENS_PER_STEP,
)
register_tag(
    "FrozenLake",
    "frozen_lake",
    {"size": 4, "p": 0.8, "is_slippery": False, "max_steps": TAG_MAX_STEPS},
    max_tokens_per_step=TAG_MAX_TOKENS_PER_STEP,
)
register_tag(
    "FrozenLakeThink",
    "frozen_lake",
    {
        "size": 4,
        "p": 0.8,
        "is_slippery": False,
        "max_steps": TAG_MAX_STEPS,
        "action_pattern": "think_answer",
    },
    max_tokens_per_step=TAG_MAX_TOKENS_PER_STEP,
)

# Single-turn and tool-use envs (they grade in the sandbox; the pool starts on first use).
from rl_envs.tasks import CountdownEnv, SingleTurnEnv, ToolEnv  # noqa: E402

register_env("single_turn", SingleTurnEnv)
register_env("countdown", CountdownEnv)
register_env("tool_use", ToolEnv)
