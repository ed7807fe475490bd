"""RLVR reward sections: ROLL's per-domain ``rewards`` and verl's ``custom_reward_function``.

Consumed by ``rl_envs.rewards.router.reward_router_spec``/``build_reward_router`` (with
``model_dump()`` of both sections); the keys of ROLL's reward workers that a sandboxed rule
reward has no use for are accepted so ROLL files load, and declared in ``rl_config.contract``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rl_config.schema.base import StrictModel

DomainRewardName = Literal[
    "math_rule",
    "code_sandbox",
    "format",
    "custom",
    "verl_default",
    "crossthinkqa",
    "llm_judge",
    "reward_model",
]
"""rl_envs.rewards.router.DOMAIN_REWARDS (a test keeps them equal)."""

MODEL_REWARD_NAMES = ("llm_judge", "reward_model")
"""Rewards a model scores on a reward worker (rl_envs.rewards.router.MODEL_REWARDS)."""
MODEL_REWARD_WORKERS = {"LLMJudgeRewardWorker": "llm_judge"}
"""ROLL worker classes that name a model reward (rl_envs.rewards.router.ROLL_WORKERS)."""
MODEL_REWARD_FIELDS = (
    "model_args", "data_args", "generating_args", "strategy_args", "device_mapping",
    "infer_batch_size", "world_size", "judge_prompt", "judge_model_type", "judge_verdict",
    "reward_normalize",
)  # fmt: skip
"""The fields a model reward's domain reads (rl_runtime.compose.model_rewards); a rule domain
ignores them (rl_config.contract warns)."""


class RewardDomain(StrictModel):
    """One reward domain (ROLL ``rewards.<domain>``): which reward scores its rows, and which
    rows (by tag) are its own."""

    def model_reward(self, domain: str) -> str | None:
        """``llm_judge`` or ``reward_model`` when a model scores this domain (named `domain`):
        by reward_fn, else by worker_cls, else by the domain's name; else None."""
        if self.reward_fn is not None:
            return self.reward_fn if self.reward_fn in MODEL_REWARD_NAMES else None
        if self.worker_cls is not None:
            return MODEL_REWARD_WORKERS.get(self.worker_cls.rsplit(".", 1)[-1])
        return domain if domain in MODEL_REWARD_NAMES else None

    reward_fn: DomainRewardName | None = Field(
        default=None,
        description="Reward of this domain: math_rule (boxed/#### answer, math-verify), "
        "code_sandbox (the row's unit tests run in the sandbox), format (format_pattern regex), "
        "custom (custom_reward_function), verl_default (verl's dispatch by data_source), "
        "crossthinkqa (ROLL's multiple-choice rule: the boxed or 'answer is' letter; reward_type), "
        "llm_judge (a generative judge model, judge_prompt, judge_verdict), reward_model (a "
        "sequence-classification reward model); the two model rewards run on a reward worker "
        "of their own (model_args, strategy_args, device_mapping). Unset: from worker_cls "
        "(MathRuleRewardWorker -> math_rule, CodeSandboxRewardWorker -> code_sandbox, "
        "CrossThinkQARuleRewardWorker -> crossthinkqa, LLMJudgeRewardWorker -> llm_judge), else "
        "the domain's name.",
    )
    worker_cls: str | None = Field(
        default=None,
        description="ROLL reward worker class; its class name picks reward_fn when that is "
        "unset. IFEval and detection workers are refused.",
    )
    tag_included: list[str] = Field(
        default_factory=list,
        description="Row tags (data_args.tag column, else data_source) scored by this domain. "
        "Rows whose tag is in no domain go to math_rule when configured (as ROLL), else to a "
        "verl_default domain when configured.",
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
        default=None,
        description="Model rewards: model_name_or_path (the judge or reward model) and dtype "
        "(fp32/bf16/fp16); rule rewards load no model.",
    )
    data_args: dict[str, Any] | None = Field(
        default=None,
        description="Model rewards: template, the chat template the model reads its input with "
        "(default native); unused by rule rewards.",
    )
    generating_args: dict[str, Any] | None = Field(
        default=None,
        description="llm_judge: the judge's sampling (max_new_tokens, temperature, top_p, top_k, "
        "do_sample).",
    )
    strategy_args: dict[str, Any] | None = Field(
        default=None,
        description="llm_judge: strategy_name (hf_infer, vllm) and strategy_config of the judge's "
        "engine; unused by rule rewards.",
    )
    device_mapping: str | list[int] | None = Field(
        default=None,
        description="Model rewards: the reward worker's devices (one worker per device; shared "
        "devices sleep the model between scorings); rule rewards use the CPU.",
    )
    world_size: int | None = Field(
        default=None,
        ge=1,
        description="Model rewards: must equal the workers of device_mapping; rule rewards: the "
        "sandbox pool size applies.",
    )
    infer_batch_size: int | None = Field(
        default=None,
        ge=1,
        description="Model rewards: responses per model call (default 8); rule rewards run per "
        "response.",
    )
    use_local: bool | None = Field(
        default=None, description="ROLL: local code execution; tests always run in the sandbox."
    )
    code_url: str | None = Field(
        default=None, description="ROLL: remote code sandbox URL (not supported)."
    )
    reward_type: str | None = Field(
        default=None,
        description="crossthinkqa: loose | soft | strict (ROLL's rewards for a right answer "
        "without a box and a boxed wrong one; default soft); other domains refuse it.",
    )
    response_length_penalty_coef: float = Field(
        default=0.0, description="ROLL: length penalty of rule workers (not supported)."
    )
    judge_prompt: str | None = Field(
        default=None,
        description="llm_judge: a ROLL prompt name (Qwen2.5-7B-Instruct-RLVR-prompt: YES/NO) "
        "or a template with {response} (and {question}, {reference}). Unset: ROLL's default "
        "0-10 score prompt.",
    )
    judge_model_type: str | None = Field(
        default=None,
        description="llm_judge: inference (a local judge model on the domain's worker; the "
        "only kind here, api judges are refused).",
    )
    judge_verdict: Literal["yes_no", "score_0_10"] | None = Field(
        default=None,
        description="llm_judge: how the verdict is read: yes_no (first standalone yes/no: 1/0) "
        "or score_0_10 ('Score: x', x/10). Unset: what judge_prompt asks for. An unreadable "
        "verdict is a counted reward failure, never a 0.",
    )
    reward_normalize: bool = Field(
        default=False,
        description="reward_model: standardise each batch's scores of this domain (zero mean, "
        "unit std over the batch) before they are rewards.",
    )
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
