"""Reward functions, graders and sandboxed reward managers.

Per-domain RLVR rewards (ROLL ``rewards:``, verl ``custom_reward_function``):
``build_reward_router``/``reward_router_spec``/``reward_metrics`` (``rl_envs.rewards.router``).
"""

from rl_envs.rewards.code_tests import parse_test_cases
from rl_envs.rewards.custom import CustomReward, load_custom_reward
from rl_envs.rewards.extraction import extract_boxed, extract_hash_answer, normalize_answer
from rl_envs.rewards.extras import (
    EXTRA_SKIP_REASONS,
    ExtraNames,
    RewardExtras,
    numeric_extras,
)
from rl_envs.rewards.manager import (
    DAPORewardManager,
    RewardInput,
    RewardManager,
    RewardOutput,
    coerce_reward,
    coerce_reward_kind,
    overlong_penalty,
    trl_arguments,
)
from rl_envs.rewards.registry import get_reward, grader_target, list_rewards, register_reward
from rl_envs.rewards.router import (
    DOMAIN_REWARDS,
    CodeRewardManager,
    CustomRewardSpec,
    DomainRewardSpec,
    RewardRouter,
    RewardRouterSpec,
    build_reward_router,
    make_reward_pool,
    reward_metrics,
    reward_router_spec,
)

MATH_PRELOAD = (
    "math_verify",
    "sympy",
    "latex2sympy2_extended",
    "rl_envs.rewards.graders",
    "rl_envs.rewards.rules",
    "rl_envs.rewards.code_tests",
)
MATH_WARMUP = ("rl_envs.rewards.graders:warmup",)

__all__ = [
    "DOMAIN_REWARDS",
    "EXTRA_SKIP_REASONS",
    "MATH_PRELOAD",
    "MATH_WARMUP",
    "CodeRewardManager",
    "CustomReward",
    "CustomRewardSpec",
    "DAPORewardManager",
    "DomainRewardSpec",
    "ExtraNames",
    "RewardExtras",
    "RewardInput",
    "RewardManager",
    "RewardOutput",
    "RewardRouter",
    "RewardRouterSpec",
    "build_reward_router",
    "coerce_reward",
    "coerce_reward_kind",
    "extract_boxed",
    "extract_hash_answer",
    "get_reward",
    "grader_target",
    "list_rewards",
    "load_custom_reward",
    "make_reward_pool",
    "normalize_answer",
    "numeric_extras",
    "overlong_penalty",
    "parse_test_cases",
    "register_reward",
    "reward_metrics",
    "reward_router_spec",
    "trl_arguments",
]
