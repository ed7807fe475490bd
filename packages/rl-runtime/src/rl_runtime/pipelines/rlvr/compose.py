"""RLVR's part of the composition: data files and columns, lengths, group size, DAPO knobs,
held-out data and sampling (ROLL's `validation` section), the reward per domain (`rl_envs.rewards.router.reward_router_spec`).
`build_rlvr(cfg)` is pure (no file is opened: a missing data
file fails when the app loads it, with its path).

Keys read here are the ones `rl_config.contract.PIPELINE_CONSUMED["rlvr"]` names (plus the shared
ones every pipeline reads); compose(cfg, pipeline="rlvr") refuses the rest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from rl_config.records import SamplingParams
from rl_envs.rewards.custom import load_custom_reward
from rl_envs.rewards.router import RewardRouterSpec, reward_router_spec
from rl_runtime.compose.losses import response_budget
from rl_runtime.compose.model_rewards import ModelRewardPlan, build_model_rewards
from rl_runtime.compose.run_settings import data_files
from rl_runtime.step.advantages import estimator_needs


@dataclass(frozen=True)
class DataPlan:
    """Where prompts come from (actor_train.data_args): files, columns, domain mixing, template.
    Held-out prompts: `val_files` rendered with `val_template` (validation.data_args, else
    actor_train.data_args.eval_file_name and the training template)."""

    train_files: tuple[str, ...]
    val_files: tuple[str, ...]
    prompt_key: str | None
    messages_key: str | None
    response_key: str
    tag_key: str
    domain_interleave_probs: dict[str, float] | None
    template: str
    val_template: str
    #: the key that named `val_files` (a missing file is reported by it)
    val_files_key: str = "actor_train.data_args.eval_file_name"


@dataclass(frozen=True)
class DynamicSamplingPlan:
    """DAPO dynamic sampling: drop groups whose G rewards are all equal and generate more prompts
    (`max_extra_rounds` more rounds at most; None = until the batch is full)."""

    enable: bool
    max_extra_rounds: int | None


@dataclass(frozen=True)
class OverlongPlan:
    """DAPO soft overlong penalty over the last `buffer_length` tokens of `response_length`."""

    enable: bool
    buffer_length: int
    penalty_factor: float


@dataclass(frozen=True)
class RlvrPlan:
    """Everything the RLVR recipe needs beyond the shared components.

    prompts_per_step: prompts per step (rollout_batch_size); group_size: G samples per prompt
    (num_return_sequences_in_group), so a step trains on prompts_per_step x G sequences.
    val_prompts: held-out prompts per evaluation (val_batch_size); val_n_sample: samples per
    held-out prompt for pass@k (k = val_n_sample); val_greedy: also greedy accuracy.
    baseline_rollout: one greedy response per training prompt as well, scored like the samples
    (the baseline of estimators that need one: remax).
    """

    data: DataPlan
    prompt_length: int
    response_length: int
    group_size: int
    prompts_per_step: int
    val_prompts: int
    val_n_sample: int
    val_greedy: bool
    dynamic_sampling: DynamicSamplingPlan
    overlong: OverlongPlan
    max_len_mask: bool
    sampling: SamplingParams  # train: n = group_size, max_new_tokens = response_length
    #: held-out sampling (validation.generating_args, else actor_infer's), n = val_n_sample
    held_out_sampling: SamplingParams
    rewards: RewardRouterSpec  # reward per domain (rewards, custom_reward_function sections)
    baseline_rollout: bool = False
    #: a prompt longer than prompt_length: "drop" (dropped and counted), or cut to its last
    #: ("left"), first ("right") or first and last halves ("middle") prompt_length tokens
    prompt_truncation: str = "drop"
    #: ROLL's difficulty filter (difficulty_mask): `(low, high)`, groups whose mean score is not
    #: strictly between are masked out of the loss; None: off
    difficulty: tuple[float, float] | None = None
    #: the domains a model scores (a generative judge, a reward model), each on its own role
    model_rewards: tuple[ModelRewardPlan, ...] = ()
    #: what a dry run should say about the plan (e.g. a multimodal template rendering text only)
    notes: tuple[str, ...] = ()

    def val_sampling(self, seed: int, greedy: bool) -> SamplingParams:
        """Held-out sampling: `val_n_sample` samples, or 1 greedy."""
        if greedy:
            return greedy_sampling(self.held_out_sampling, seed)
        return msgspec.structs.replace(self.held_out_sampling, seed=seed)

    def baseline_sampling(self, seed: int) -> SamplingParams | None:
        """The training prompts' greedy baseline response (None without `baseline_rollout`)."""
        return greedy_sampling(self.sampling, seed) if self.baseline_rollout else None


def greedy_sampling(sampling: SamplingParams, seed: int) -> SamplingParams:
    """`sampling` as one greedy response (its length budget and stops kept)."""
    return msgspec.structs.replace(sampling, n=1, temperature=0.0, top_p=1.0, top_k=-1, seed=seed)


TEXT_ONLY_TEMPLATES = ("qwen2-vl",)
"""Templates of multimodal models that render text only here (rows with images are refused)."""


REWARD_DOMAIN_KEYS = (
    "reward_fn", "worker_cls", "tag_included", "format_pattern", "timeout_s", "reward_type",
)  # fmt: skip
CUSTOM_REWARD_KEYS = ("path", "name", "style", "reward_kwargs")


def build_rewards(cfg: Any) -> RewardRouterSpec:
    """`rewards` (per domain) and `custom_reward_function` -> the reward router's spec. ROLL's
    other reward-worker keys are declared in the contract; a domain this stack cannot score (an
    LLM judge ...) is listed in `spec.unsupported` (the app refuses to run it, a dry run warns)."""
    rewards = {
        domain: {k: getattr(section, k) for k in REWARD_DOMAIN_KEYS}
        for domain, section in (cfg.rewards or {}).items()
    }
    custom = {k: getattr(cfg.custom_reward_function, k) for k in CUSTOM_REWARD_KEYS}
    return reward_router_spec(rewards or None, custom, allow_unsupported=True)


def custom_reward_problem(rewards: RewardRouterSpec) -> str | None:
    """Why the custom reward file cannot be used (missing, no function `name`, a syntax error,
    a signature neither verl's nor TRL's: read with `ast`, nothing runs), naming the key; None
    when it can, or there is none. A refusal of `compose_rlvr`: a dry run lists it, a run stops
    before it builds anything (it ended in the reward router's traceback after the warm-up)."""
    custom = rewards.custom
    if custom is None:
        return None
    try:
        load_custom_reward(custom.path, custom.name, custom.style)
    except OSError as exc:
        return f"custom_reward_function.path: {exc}"
    except ValueError as exc:
        return (
            f"custom_reward_function (path={custom.path}, name={custom.name}, "
            f"style={custom.style}): {exc}"
        )
    return None


def check_domain_mix(probs: dict[str, float], rewards: RewardRouterSpec) -> str:
    """`actor_train.data_args.domain_interleave_probs`: finite probabilities >= 0 summing to
    more than 0 and at most 1, over reward domains (rows get their domain from the `rewards`
    section; without one, the only domain is `verl_default`, or `custom` with a
    custom_reward_function). ValueError naming the key; checked here so that a dry run says so,
    not the run after the model is built. Returns the warning for a sum below 1 (the last
    domain takes the remainder, as in ROLL), else ''."""
    from rl_envs.tasks.sampler import check_domain_probs, remainder_note

    key = "actor_train.data_args.domain_interleave_probs"
    try:
        check_domain_probs(probs)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None
    unknown = sorted(set(probs) - set(rewards.domains) - set(rewards.unsupported))
    if unknown:
        raise ValueError(
            f"{key} names {unknown}, which are not reward domains; the domains are "
            f"{sorted([*rewards.domains, *rewards.unsupported])}"
        )
    note = remainder_note(probs)
    return f"actor_train.data_args.{note}" if note else ""


@dataclass(frozen=True)
class _HeldOut:
    files: tuple[str, ...]
    files_key: str
    template: str
    sampling: SamplingParams


def build_held_out(cfg: Any, response_length: int) -> _HeldOut:
    """Held-out files, template and sampling: ROLL's `validation` section when set (its
    data_args.file_name and template, its generating_args), else
    actor_train.data_args.eval_file_name with the training template and sampling. Keys that
    would disagree (two sources of held-out files, a second eval cadence) are refused by name."""
    from rl_rollout.templates import list_templates
    from rl_runtime.compose.sampling import build_sampling

    data, val = cfg.actor_train.data_args, cfg.validation
    files, template = data_files(data.eval_file_name), data.template
    files_key = "actor_train.data_args.eval_file_name"
    gen, max_new = cfg.actor_infer.generating_args, response_length
    if val is not None:
        val_files = data_files(val.data_args.file_name)
        if val_files and files:
            raise ValueError(
                "validation.data_args.file_name and actor_train.data_args.eval_file_name both "
                "name held-out files; set one"
            )
        files = val_files or files
        files_key = "validation.data_args.file_name" if val_files else files_key
        if "template" in val.data_args.model_fields_set:
            template = val.data_args.template
            if template not in list_templates():
                raise ValueError(
                    f"validation.data_args.template={template!r}: unknown; known: "
                    f"{list_templates()}"
                )
        if val.generating_args is not None:
            gen = val.generating_args
            if "max_new_tokens" in gen.model_fields_set:
                max_new = gen.max_new_tokens
            n = gen.num_return_sequences
            if n not in (1, cfg.val_n_sample):
                raise ValueError(
                    f"validation.generating_args.num_return_sequences={n} differs from "
                    f"val_n_sample={cfg.val_n_sample} (the samples per held-out prompt)"
                )
        if val.eval_steps is not None and val.eval_steps != cfg.eval_steps:
            raise ValueError(
                f"validation.eval_steps={val.eval_steps} differs from eval_steps="
                f"{cfg.eval_steps}: evaluation runs every eval_steps (set them equal or drop "
                "validation.eval_steps)"
            )
    sampling = msgspec.structs.replace(build_sampling(gen, max_new), n=cfg.val_n_sample)
    return _HeldOut(files, files_key, template, sampling)


def build_rlvr(cfg: Any) -> RlvrPlan:
    """The RLVR plan of a validated config; ValueError names the key at fault."""
    from rl_rollout.templates import list_templates
    from rl_runtime.compose.sampling import build_sampling

    data = cfg.actor_train.data_args
    if data.prompt and data.messages:
        raise ValueError(
            "actor_train.data_args: set either `prompt` or `messages` (the prompt column), not both"
        )
    if data.template not in list_templates():
        raise ValueError(
            f"actor_train.data_args.template={data.template!r}: unknown; known: {list_templates()}"
        )
    train_files = data_files(data.file_name)
    if not train_files:
        raise ValueError("actor_train.data_args.file_name: RLVR needs a training data file")
    group = cfg.num_return_sequences_in_group
    gen = cfg.actor_infer.generating_args
    n_gen = gen.num_return_sequences
    if n_gen not in (1, group):
        raise ValueError(
            f"actor_infer.generating_args.num_return_sequences={n_gen} differs from "
            f"num_return_sequences_in_group={group} (set it to 1 or to the group size)"
        )
    response_length = response_budget(cfg)
    prompt_length = cfg.prompt_length or max(1, (cfg.sequence_length or 1024) - response_length)
    ds, ol = cfg.dynamic_sampling, cfg.overlong_penalty
    if ol.enable and ol.buffer_length > response_length:
        raise ValueError(
            f"overlong_penalty.buffer_length={ol.buffer_length} exceeds the response length "
            f"{response_length}"
        )
    rewards = build_rewards(cfg)
    probs = dict(data.domain_interleave_probs or {}) or None
    mix_note = check_domain_mix(probs, rewards) if probs is not None else ""
    if cfg.val_n_sample < 1:
        raise ValueError(f"val_n_sample must be >= 1, got {cfg.val_n_sample}")
    held_out = build_held_out(cfg, response_length)
    model_rewards = build_model_rewards(cfg)
    return RlvrPlan(
        data=DataPlan(
            train_files=train_files,
            val_files=held_out.files,
            val_files_key=held_out.files_key,
            prompt_key=data.prompt,
            messages_key=data.messages,
            response_key=data.response,
            tag_key=data.tag,
            domain_interleave_probs=probs,
            template=data.template,
            val_template=held_out.template,
        ),
        prompt_length=prompt_length,
        response_length=response_length,
        group_size=group,
        prompts_per_step=cfg.rollout_batch_size,
        val_prompts=cfg.val_batch_size,
        val_n_sample=cfg.val_n_sample,
        val_greedy=cfg.val_greedy,
        dynamic_sampling=DynamicSamplingPlan(
            enable=ds.enable, max_extra_rounds=ds.max_num_gen_batches or None
        ),
        overlong=OverlongPlan(
            enable=ol.enable, buffer_length=ol.buffer_length, penalty_factor=ol.penalty_factor
        ),
        max_len_mask=cfg.max_len_mask,
        sampling=msgspec.structs.replace(build_sampling(gen, response_length), n=group),
        held_out_sampling=held_out.sampling,
        rewards=rewards,
        baseline_rollout="baseline_scores" in estimator_needs(cfg.adv_estimator),
        prompt_truncation=cfg.prompt_truncation,
        difficulty=(cfg.difficulty_low_threshold, cfg.difficulty_high_threshold)
        if cfg.difficulty_mask
        else None,
        notes=tuple(
            f"{key}={name!r} renders text only: rows with image/video inputs are refused when "
            "the data loads (multimodal inputs are not implemented)"
            for key, name in (
                ("actor_train.data_args.template", data.template),
                ("validation.data_args.template", held_out.template),
            )
            if name in TEXT_ONLY_TEMPLATES and (key.startswith("actor") or name != data.template)
        )
        + ((mix_note,) if mix_note else ())
        + tuple(note for m in model_rewards for note in m.notes),
        model_rewards=model_rewards,
    )


def compose_rlvr(cfg: Any) -> Any:  # -> rl_runtime.cli.app_main.Composed
    """What apps/rlvr runs: the shared components (pipeline "rlvr", with a role per model
    reward) and the RLVR plan; reward
    domains no scorer can score, and a custom reward file that cannot be used, are refusals (a
    dry run lists them, a run stops)."""
    import dataclasses
    import pprint

    from rl_runtime.cli.app_main import Composed
    from rl_runtime.run.runner import compose_here

    components, plan = compose_here(cfg, pipeline="rlvr"), build_rlvr(cfg)
    if plan.model_rewards:  # their roles, placed with the others
        roles = (*components.roles, *(m.role_plan() for m in plan.model_rewards))
        components = dataclasses.replace(components, roles=roles)
    unscorable = [f"{why} (rewards.{d})" for d, why in plan.rewards.unsupported.items()]
    unusable = custom_reward_problem(plan.rewards)
    if unusable is not None:
        unscorable.append(unusable)
    details = "rlvr: " + pprint.pformat(plan, width=98, sort_dicts=False).replace("\n", "\n  ")
    return Composed(components, plan, notes=tuple(plan.notes), details=details,
                    refusals=tuple(unscorable))  # fmt: skip
