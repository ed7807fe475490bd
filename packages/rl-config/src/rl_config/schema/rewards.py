"""RLVR reward sections: ROLL's per-domain ``rewards`` and verl's ``custom_reward_function``.

Consumed by ``rl_envs.rewards.router.reward_router_spec``/``build_reward_router`` (with
``model_dump()`` of both sections); the keys of ROLL's reward workers that a sandboxed rule
reward has no use for are accepted so ROLL files load, and declared in ``rl_config.contract``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rl_config.schema.base import StrictModel

DomainRewardName = Literal["math_rule", "code_sandbox", "format", "custom", "verl_default"]
"""rl_envs.rewards.router.DOMAIN_REWARDS (a test keeps them equal)."""


class RewardDomain(StrictModel):
    """One reward domain (ROLL ``rewards.<domain>``): which reward scores its rows, and which
    rows (by tag) are its own."""

    reward_fn: DomainRewardName | None = Field(
        default=None,
        description="Reward of this domain: math_rule (boxed/#### answer, math-verify), "
        "code_sandbox (the row's unit tests run in the sandbox), format (format_pattern regex), "
        "custom (custom_reward_function), verl_default (verl's dispatch by data_source). Unset: "
        "from worker_cls (MathRuleRewardWorker -> math_rule, CodeSandboxRewardWorker -> "
        "code_sandbox), else the domain's name.",
    )
    worker_cls: str | None = Field(
        default=None,
        description="ROLL reward worker class; its class name picks reward_fn when that is "
        "unset. LLM-judge, IFEval, CrossThink-QA and detection workers are refused.",
    )
    tag_included: list[str] = Field(
        default_factory=list,
        description="Row tags (data_args.tag column, else data_source) scored by this domain. "
        "Rows whose tag is in no domain go to math_rule when configured (as ROLL).",
    )
    format_pattern: str | None = Field(
        default=None,
        description="reward_fn format: regex the whole response must match (DOTALL) for 1.0.",
    )
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Seconds per sandboxed reward call of this domain (code_sandbox: per unit "
        "test). Unset: the sandbox's limit (code_sandbox: 2 s per test).",
    )
    # ROLL reward-worker keys (a rule reward runs in the sandbox, not on a model worker)
    model_args: dict[str, Any] | None = Field(
        default=None, description="ROLL: reward model; rule rewards load no model."
    )
    data_args: dict[str, Any] | None = Field(
        default=None, description="ROLL: reward worker template; unused by rule rewards."
    )
    generating_args: dict[str, Any] | None = Field(
        default=None, description="ROLL: LLM-judge sampling; LLM judges are refused."
    )
    strategy_args: dict[str, Any] | None = Field(
        default=None, description="ROLL: reward worker backend; rule rewards have none."
    )
    device_mapping: str | list[int] | None = Field(
        default=None, description="ROLL: reward worker devices; rule rewards use the CPU."
    )
    world_size: int | None = Field(
        default=None, ge=1, description="ROLL: reward workers; the sandbox pool size applies."
    )
    infer_batch_size: int | None = Field(
        default=None, ge=1, description="ROLL: reward worker batch; calls run per response."
    )
    use_local: bool | None = Field(
        default=None, description="ROLL: local code execution; tests always run in the sandbox."
    )
    code_url: str | None = Field(
        default=None, description="ROLL: remote code sandbox URL (not supported)."
    )
    reward_type: str | None = Field(
        default=None, description="ROLL: soft/hard scoring of IFEval/CrossThink-QA workers."
    )
    response_length_penalty_coef: float = Field(
        default=0.0, description="ROLL: length penalty of rule workers (not supported)."
    )
    judge_prompt: str | None = Field(default=None, description="ROLL: LLM-judge prompt.")
    judge_model_type: str | None = Field(default=None, description="ROLL: LLM-judge kind.")
    judge_model_name: str | None = Field(default=None, description="ROLL: LLM-judge model.")
    judge_api_url: str | None = Field(default=None, description="ROLL: LLM-judge API URL.")
    judge_api_key: str | None = Field(default=None, description="ROLL: LLM-judge API key.")
    query_filter_config: dict[str, Any] | None = Field(
        default=None, description="ROLL: reward-based prompt filter (not supported)."
    )
    response_filter_config: dict[str, Any] | None = Field(
        default=None, description="ROLL: reward-based response filter (not supported)."
    )
    reward_manager_config: list[dict[str, Any]] | None = Field(
        default=None, description="ROLL: reward-system plugins (not supported)."
    )


class CustomRewardFunction(StrictModel):
    """verl's ``custom_reward_function``: a user reward file, run only in the sandbox."""

    path: str | None = Field(
        default=None,
        description="Python file defining the reward function (read and checked with ast, "
        "run only in the rl-envs sandbox). Unset: no custom reward. Without a rewards "
        "section it scores every row; with one, the domains with reward_fn: custom.",
    )
    name: str = Field(
        default="compute_score",
        min_length=1,
        description="Function in path: verl's (data_source, solution_str, ground_truth, "
        "extra_info) per response, or TRL's (prompts, completions, **columns) per batch "
        "returning a list; may be async; returns a float or a dict with score (other entries "
        "become metrics).",
    )
    style: Literal["auto", "verl", "trl"] = Field(
        default="auto",
        description="Signature of the function; auto: TRL when it takes completions and no "
        "solution_str.",
    )
    reward_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments passed to every call."
    )
