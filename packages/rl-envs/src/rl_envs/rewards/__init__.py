"""Reward functions, graders and sandboxed reward managers."""

from rl_envs.rewards.custom import CustomReward, load_custom_reward
from rl_envs.rewards.extraction import extract_boxed, extract_hash_answer, normalize_answer
from rl_envs.rewards.manager import (
    DAPORewardManager,
    RewardInput,
    RewardManager,
    RewardOutput,
    coerce_reward,
)
from rl_envs.rewards.registry import get_reward, grader_target, list_rewards, register_reward

MATH_PRELOAD = ("math_verify", "sympy", "latex2sympy2_extended", "rl_envs.rewards.graders")
MATH_WARMUP = ("rl_envs.rewards.graders:warmup",)

__all__ = [
    "MATH_PRELOAD",
    "MATH_WARMUP",
    "CustomReward",
    "DAPORewardManager",
    "RewardInput",
    "RewardManager",
    "RewardOutput",
    "coerce_reward",
    "extract_boxed",
    "extract_hash_answer",
    "get_reward",
    "grader_target",
    "list_rewards",
    "load_custom_reward",
    "normalize_answer",
    "register_reward",
]
