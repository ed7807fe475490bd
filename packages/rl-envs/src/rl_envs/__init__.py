"""Gym-like text environments, verifiable rewards and a sandbox for untrusted reward code.

``import rl_envs`` needs only numpy; math-verify, pyarrow and pillow are imported lazily.
"""

from importlib.metadata import PackageNotFoundError, version

from rl_envs.base import Env, EpisodeOverError, TextGameEnv
from rl_envs.registry import (
    env_options,
    get_tag,
    list_env_types,
    list_tags,
    make_env,
    prompt_options,
    register_env,
    register_tag,
)
from rl_envs.solvers import solve, solve_actions

try:
    __version__ = version("rl-envs")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"

TAGS = (
    "SimpleSokoban",
    "LargerSokoban",
    "SokobanDifferentGridVocab",
    "FrozenLake",
    "FrozenLakeThink",
)

__all__ = [
    "TAGS",
    "Env",
    "EpisodeOverError",
    "TextGameEnv",
    "__version__",
    "env_options",
    "get_tag",
    "list_env_types",
    "list_tags",
    "make_env",
    "prompt_options",
    "register_env",
    "register_tag",
    "solve",
    "solve_actions",
]
