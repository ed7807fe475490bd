"""Reward functions by name. A reward is a ``"module:function"`` target with verl's signature
``(data_source, solution_str, ground_truth, extra_info) -> float | dict`` so it can be run in the
sandbox by import."""

from __future__ import annotations

_REWARDS: dict[str, str] = {
    "default": "rl_envs.rewards.graders:default_compute_score",
    "math_rule": "rl_envs.rewards.rules:math_rule_score",
    "format": "rl_envs.rewards.rules:format_score",
    "code_sandbox": "rl_envs.rewards.code_tests:code_sandbox_score",
    "crossthinkqa": "rl_envs.rewards.rules:crossthinkqa_score",
}
# Rewards that only parse the response (never run it): several responses may share one sandbox
# call (``SandboxPool.call_each``). Code that runs the response gets a fresh process each time.
_READS_ONLY: set[str] = {"default", "math_rule", "format", "crossthinkqa"}
_GRADERS: dict[str, str] = {
    "gsm8k": "rl_envs.rewards.graders:gsm8k_score",
    "math": "rl_envs.rewards.graders:math_score",
    "dapo": "rl_envs.rewards.graders:dapo_score",
    "countdown": "rl_envs.rewards.graders:countdown_score",
    "answer": "rl_envs.rewards.graders:answer_score",
}


def register_reward(name: str, target: str, *, reads_only: bool = False) -> None:
    """Register ``target`` (``"module:function"``, verl signature) under ``name``.
    ``reads_only``: it parses the response and never runs it, so a batch of responses may be
    scored in one sandbox call."""
    if ":" not in target:
        raise ValueError(f"reward target must be 'module:function', got {target!r}")
    if name in _REWARDS:
        raise ValueError(f"reward {name!r} is already registered")
    _REWARDS[name] = target
    if reads_only:
        _READS_ONLY.add(name)


def get_reward(name: str) -> str:
    if name not in _REWARDS:
        raise KeyError(f"unknown reward {name!r}; known: {sorted(_REWARDS)}")
    return _REWARDS[name]


def reads_only(name: str) -> bool:
    """True for a registered reward that never runs the response (see ``register_reward``)."""
    return name in _READS_ONLY


def grader_target(name: str) -> str:
    """Target of a ``(solution_str, ground_truth)`` grader: gsm8k, math, dapo, countdown."""
    if name not in _GRADERS:
        raise KeyError(f"unknown grader {name!r}; known: {sorted(_GRADERS)}")
    return _GRADERS[name]


def list_rewards() -> list[str]:
    return sorted(_REWARDS)
