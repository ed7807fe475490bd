"""Model rewards of the RLVR plan: each `rewards.<domain>` whose reward is a model (`llm_judge`:
a generative judge; `reward_model`: a sequence-classification reward model) becomes a
`ModelRewardPlan` and a role of its own, `reward_<domain>`, placed by the domain's
`device_mapping` like any other role (shared devices: the model sleeps between scorings).

Keys read here, per model domain: model_args (model_name_or_path, dtype), data_args.template,
generating_args (judge), strategy_args (judge engine), device_mapping, world_size (checked),
infer_batch_size, timeout_s, judge_prompt, judge_model_type, judge_verdict, reward_normalize;
the same keys of a rule domain are warned about by rl_config.contract. Pure: nothing is loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from rl_config.records import SamplingParams
from rl_runtime.compose.components import RolePlan

ROLE_PREFIX = "reward_"
DEFAULT_BATCH_SIZE = 8
#: model_args entries a model reward reads; the rest of ROLL's are named in a note
MODEL_ARGS_READ = ("model_name_or_path", "dtype")
RM_STRATEGIES = ("hf_infer",)
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class ModelRewardPlan:
    """One model-scored domain. `kind`: llm_judge | reward_model; `role`: its workers' role;
    `batch_size`: responses per model call; `timeout_s`: per scoring call (a call past it is a
    counted failure of its responses). Judge: `sampling` of the verdict, `judge_prompt` (the
    template) and `verdict` (rl_envs.rewards.judge.VERDICT_RULES). Reward model:
    `normalize` standardises a batch's scores."""

    domain: str
    kind: str
    role: str
    model_path: str
    dtype: str
    device_mapping: tuple[int, ...]
    strategy_name: str
    strategy_config: dict[str, Any]
    template: str
    batch_size: int
    timeout_s: float
    sampling: SamplingParams | None = None
    judge_prompt: str = field(default="", repr=False)
    verdict: str = ""
    normalize: bool = False
    #: the domain's `tag_included` (agentic episode-end scoring: the env tags it scores)
    tags: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=(), repr=False)

    def role_plan(self) -> RolePlan:
        return RolePlan(
            role=self.role, device_mapping=self.device_mapping, devices_per_worker=1,
            strategy_name=self.strategy_name, strategy_config=dict(self.strategy_config),
            model_path=self.model_path, dtype=self.dtype, reward=self.kind,
            template=self.template,
        )  # fmt: skip


def build_model_rewards(cfg: Any) -> tuple[ModelRewardPlan, ...]:
    """The plans of `cfg.rewards`' model domains (ValueError naming the key at fault); a
    domain's `timeout_s` defaults to `rpc_timeout`."""
    return tuple(
        _plan(domain, section, kind, cfg)
        for domain, section in (cfg.rewards or {}).items()
        if (kind := section.model_reward(domain)) is not None
    )


def build_episode_rewards(cfg: Any, env_tags: Sequence[str]) -> tuple[ModelRewardPlan, ...]:
    """The model domains that score agentic episodes at their end (ValueError naming the key at
    fault): each scores the episodes of the env tags in its `tag_included` (empty: every tag of
    `env_tags`, the training and validation envs'); a tag is scored by one domain at most, and
    a tag no env has is an error. Rule domains do not apply to episodes (rl_config.contract
    warns about them)."""
    plans = build_model_rewards(cfg)
    owner: dict[str, str] = {}
    for p in plans:
        unknown = sorted(set(p.tags) - set(env_tags))
        if unknown:
            raise ValueError(
                f"rewards.{p.domain}.tag_included: {unknown} are no env's tag; the envs' tags: "
                f"{sorted(env_tags)}"
            )
        for tag in p.tags or env_tags:
            if tag in owner:
                raise ValueError(
                    f"rewards.{p.domain}.tag_included: env tag {tag!r} is scored by "
                    f"rewards.{owner[tag]} already; an episode is scored by one model"
                )
            owner[tag] = p.domain
    return tuple(p if p.tags else replace(p, tags=tuple(env_tags)) for p in plans)


def _plan(domain: str, s: Any, kind: str, cfg: Any) -> ModelRewardPlan:
    from rl_config.ranges import parse_device_list
    from rl_rollout.templates import list_templates

    key = f"rewards.{domain}"
    model_args = dict(s.model_args or {})
    path = model_args.get("model_name_or_path")
    if not isinstance(path, str) or not path:
        raise ValueError(f"{key}.model_args.model_name_or_path: {kind} needs its model's path")
    dtype = model_args.get("dtype") or "fp32"
    if dtype not in DTYPES:
        raise ValueError(f"{key}.model_args.dtype={dtype!r}: one of {sorted(DTYPES)}")
    notes = tuple(
        f"{key}.model_args.{name} has no effect on a {kind} model (read: {list(MODEL_ARGS_READ)})"
        for name in sorted(set(model_args) - set(MODEL_ARGS_READ))
    )
    template = (s.data_args or {}).get("template") or "native"
    if template not in list_templates():
        raise ValueError(
            f"{key}.data_args.template={template!r}: unknown; known: {list_templates()}"
        )
    if s.device_mapping is None:
        raise ValueError(
            f"{key}.device_mapping: {kind} runs on workers of its own; name their devices"
        )
    try:
        devices = tuple(parse_device_list(s.device_mapping))
    except ValueError as exc:
        raise ValueError(f"{key}.device_mapping: {exc}") from None
    if not devices:
        raise ValueError(f"{key}.device_mapping: empty")
    if s.world_size is not None and s.world_size != len(devices):
        raise ValueError(
            f"{key}.world_size={s.world_size}: its device_mapping gives {len(devices)} workers"
        )
    batch = s.infer_batch_size or DEFAULT_BATCH_SIZE
    timeout = float(s.timeout_s) if s.timeout_s is not None else float(cfg.rpc_timeout)
    common: dict[str, Any] = dict(domain=domain, kind=kind, role=f"{ROLE_PREFIX}{domain}", model_path=path,
                  dtype=DTYPES[dtype], device_mapping=devices, template=template,
                  batch_size=batch, timeout_s=timeout, tags=tuple(s.tag_included),
                  notes=notes)  # fmt: skip
    if kind == "llm_judge":
        return _judge(key, s, common)
    for name in ("generating_args", "judge_prompt", "judge_model_type", "judge_verdict"):
        if getattr(s, name) is not None:
            raise ValueError(f"{key}.{name}: a reward model does not generate nor judge")
    strategy = dict(s.strategy_args or {})
    name = strategy.get("strategy_name") or "hf_infer"
    if name not in RM_STRATEGIES or strategy.get("strategy_config"):
        raise ValueError(
            f"{key}.strategy_args: a reward model runs on {list(RM_STRATEGIES)} without options, "
            f"got {strategy}"
        )
    return ModelRewardPlan(**common, strategy_name=name, strategy_config={},
                           normalize=bool(s.reward_normalize))  # fmt: skip


def _judge(key: str, s: Any, common: dict[str, Any]) -> ModelRewardPlan:
    from rl_config.schema.worker import GeneratingArgs
    from rl_envs.rewards.judge import resolve_judge_prompt
    from rl_rollout.registry import engine_option_problems, list_engines
    from rl_runtime.compose.sampling import build_sampling

    if s.judge_model_type not in (None, "inference"):
        raise ValueError(
            f"{key}.judge_model_type={s.judge_model_type!r}: only inference (a local judge model "
            "on the domain's workers) is implemented; remote judge APIs are not"
        )
    for name in ("judge_api_url", "judge_api_key", "judge_model_name"):
        if getattr(s, name) is not None:
            raise ValueError(f"{key}.{name}: remote judge APIs are not implemented")
    if s.reward_normalize:
        raise ValueError(f"{key}.reward_normalize: applies to reward_model domains only")
    prompt, verdict = resolve_judge_prompt(s.judge_prompt, f"{key}.judge_prompt")
    try:
        gen = GeneratingArgs.model_validate(s.generating_args or {})
    except ValueError as exc:
        raise ValueError(f"{key}.generating_args: {exc}") from None
    if gen.num_return_sequences != 1 or gen.num_beams != 1:
        raise ValueError(
            f"{key}.generating_args: a judge gives one verdict (num_return_sequences 1, num_beams 1)"
        )
    strategy = dict(s.strategy_args or {})
    name = strategy.get("strategy_name") or "hf_infer"
    options = dict(strategy.get("strategy_config") or {})
    if name not in list_engines():
        raise ValueError(
            f"{key}.strategy_args.strategy_name={name!r}: unknown engine; known: {list_engines()}"
        )
    problems = engine_option_problems(name, options)
    if problems:
        raise ValueError("; ".join(f"{key}.strategy_args.strategy_config.{k}: {why}"
                                   for k, why in sorted(problems.items())))  # fmt: skip
    sampling = msgspec.structs.replace(build_sampling(gen, gen.max_new_tokens), n=1)
    return ModelRewardPlan(**common, strategy_name=name, strategy_config=options,
                           sampling=sampling, judge_prompt=prompt,
                           verdict=s.judge_verdict or verdict)  # fmt: skip
