"""Cross-field rules of an experiment: each returns issues a user can act on (no asserts).

``check_rules`` gives the errors (the config is rejected); ``collect_warnings`` gives legal but
suspicious settings. Both are pure functions of a derived ``ExperimentConfig``.
"""

from __future__ import annotations

import difflib
import math
import string
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from rl_config.errors import ConfigIssue
from rl_config.roll_compat import ROLL_TEMPLATE_PLACEHOLDERS
from rl_config.schema.agentic import TEMPLATE_FIELDS, EnvManagerConfig
from rl_config.schema.algorithm import STD_FREE_ESTIMATORS, STD_SCALING_METHODS
from rl_config.schema.worker import (
    DTYPE_NAMES,
    FORWARD_STRATEGIES,
    FSDP2_OPTIONS,
    INFER_STRATEGIES,
    KNOWN_UNSUPPORTED_STRATEGIES,
    TRAIN_STRATEGIES,
    GeneratingArgs,
    WorkerConfig,
)

if TYPE_CHECKING:
    from rl_config.schema.experiment import ExperimentConfig

Issues = list[ConfigIssue]

ROLE_STRATEGIES: dict[str, tuple[str, ...]] = {
    "actor_train": TRAIN_STRATEGIES,
    "critic": TRAIN_STRATEGIES,
    "actor_infer": INFER_STRATEGIES,
    "reference": FORWARD_STRATEGIES,
}
TRAIN_ROLES = ("actor_train", "critic")


def _or_list(names: tuple[str, ...]) -> str:
    return " or ".join(names) if len(names) <= 2 else ", ".join(names[:-1]) + " or " + names[-1]


def check_strategies(cfg: ExperimentConfig) -> Issues:
    """Each role's strategy_name is implemented and fits the role."""
    issues: Issues = []
    all_supported = sorted(set(TRAIN_STRATEGIES + INFER_STRATEGIES))
    for role, worker in cfg.workers().items():
        if worker.strategy_args is None:
            continue
        name = worker.strategy_args.strategy_name
        allowed = ROLE_STRATEGIES[role]
        path = f"{role}.strategy_args.strategy_name"
        if name in allowed:
            continue
        if name in KNOWN_UNSUPPORTED_STRATEGIES:
            msg = f"'{name}' is not supported; use {_or_list(allowed)}"
            if name.startswith("megatron"):
                msg += " (Megatron-LM is not implemented in this stack)"
        elif name in all_supported:
            msg = f"'{name}' cannot be used for {role}; use {_or_list(allowed)}"
        else:
            close = difflib.get_close_matches(
                name, all_supported + list(KNOWN_UNSUPPORTED_STRATEGIES), 1
            )
            hint = f"; did you mean '{close[0]}'?" if close and close[0] in allowed else ""
            msg = f"unknown strategy '{name}'{hint} ({role} supports {_or_list(allowed)})"
        issues.append(ConfigIssue(path, msg))
    return issues


def check_fsdp2_options(cfg: ExperimentConfig) -> Issues:
    """fsdp2_train's strategy_config holds only options the FSDP2 backend knows."""
    issues: Issues = []
    for role, worker in cfg.workers().items():
        strategy = worker.strategy_args
        if strategy is None or strategy.strategy_name != "fsdp2_train":
            continue
        for key, value in (strategy.strategy_config or {}).items():
            path = f"{role}.strategy_args.strategy_config.{key}"
            if key not in FSDP2_OPTIONS:
                close = difflib.get_close_matches(key, list(FSDP2_OPTIONS), 1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                issues.append(
                    ConfigIssue(
                        path,
                        f"unknown fsdp2_train option; {hint}(known: {', '.join(FSDP2_OPTIONS)})",
                    )
                )
            elif key.endswith("_dtype") and value not in DTYPE_NAMES:
                issues.append(
                    ConfigIssue(path, f"is {value!r}; use one of {', '.join(DTYPE_NAMES)}")
                )
    return issues


OFFLINE_PIPELINES = ("dpo", "sft")
"""Pipelines that train on a fixed dataset: no rollout, no advantages; a step's batch is
per_device_train_batch_size x gradient_accumulation_steps x ranks."""

_ABSENT = object()


def deepspeed_owned(cfg: ExperimentConfig, role: str, worker: WorkerConfig) -> list[tuple]:
    """``(deepspeed key, value the backend sets or None if it drops the key, config keys that
    control it)`` for what rl_train's deepspeed_train backend overrides (resolve_ds_config)."""
    dtype = worker.model_args.dtype
    owned: list[tuple] = [
        ("bf16.enabled", dtype == "bf16", f"{role}.model_args.dtype"),
        ("fp16.enabled", dtype == "fp16", f"{role}.model_args.dtype"),
    ]
    if role not in TRAIN_ROLES:
        return owned
    args, prefix = worker.training_args, f"{role}.training_args"
    micro, gas = args.per_device_train_batch_size, args.gradient_accumulation_steps
    dpo = cfg.pipeline_kind == "dpo"  # micro-batches hold the pair's rows: set by the DPO loss
    return [
        *owned,
        ("train_micro_batch_size_per_gpu", None if dpo else micro,
         f"{prefix}.per_device_train_batch_size"),
        ("gradient_accumulation_steps", gas, f"{prefix}.gradient_accumulation_steps"),
        ("train_batch_size", None if dpo else micro * gas * (worker.world_size or 1),
         f"{prefix}.per_device_train_batch_size x gradient_accumulation_steps x world size"),
        ("gradient_clipping", cfg.max_grad_norm, "max_grad_norm"),
        ("optimizer", None, f"{prefix}.learning_rate, weight_decay, adam_beta1/2, adam_epsilon"),
        ("scheduler", None, f"{prefix}.lr_scheduler_type, warmup_steps/warmup_ratio"),
    ]  # fmt: skip


def deepspeed_overrides(cfg: ExperimentConfig) -> list[str]:
    """Warnings for explicit deepspeed_train strategy_config values the backend replaces or
    drops (``"auto"`` and values equal to what it sets pass), naming the controlling key."""
    out: list[str] = []
    for role, worker in cfg.workers().items():
        strategy = worker.strategy_args
        if strategy is None or strategy.strategy_name != "deepspeed_train":
            continue
        options = strategy.strategy_config or {}
        for key, value, control in deepspeed_owned(cfg, role, worker):
            section, _, leaf = key.rpartition(".")
            node = options.get(section) if section else options
            given = node.get(leaf, _ABSENT) if isinstance(node, dict) else _ABSENT
            if given is _ABSENT or given == "auto" or (value is not None and given == value):
                continue
            path = f"{role}.strategy_args.strategy_config.{key}"
            effect = "is dropped" if value is None else f"is replaced by {value!r}"
            out.append(f"{path}: {given!r} {effect} (set by {control}); remove it or write auto")
    return out


def check_remote_code(cfg: ExperimentConfig) -> Issues:
    """No role's strategy_config turns remote model code on (as model_args.trust_remote_code
    cannot): the key may only be false."""
    from rl_config.contract import UNSUPPORTED

    reason = UNSUPPORTED["*.model_args.trust_remote_code"]
    issues: Issues = []
    for role, worker in cfg.workers().items():
        options = worker.strategy_args.strategy_config if worker.strategy_args else None
        value = (options or {}).get("trust_remote_code", False)
        if value is not False:
            issues.append(
                ConfigIssue(
                    f"{role}.strategy_args.strategy_config.trust_remote_code",
                    f"{value!r} is not supported: {reason}; remove it",
                )
            )
    return issues


def check_model_paths(cfg: ExperimentConfig) -> Issues:
    """Every worker knows which model to load."""
    issues: Issues = []
    missing = [r for r, w in cfg.workers().items() if w.model_args.model_name_or_path is None]
    if cfg.pretrain is None and len(missing) > 1:
        return [
            ConfigIssue(
                "pretrain",
                f"no model given: set `pretrain:` (a local path or hub id) used by "
                f"{', '.join(missing)}, or each worker's model_args.model_name_or_path",
            )
        ]
    for role, worker in cfg.workers().items():
        if worker.model_args.model_name_or_path is None:
            fix = "set `reward_pretrain:` or `pretrain:`" if role == "critic" else "set `pretrain:`"
            issues.append(
                ConfigIssue(
                    f"{role}.model_args.model_name_or_path",
                    f"no model for {role}: {fix} (a local path or hub id) or this key",
                )
            )
    return issues


def check_node_resources(cfg: ExperimentConfig) -> Issues:
    """One distinct, non-empty Ray resource name per node."""
    names = cfg.node_resources
    if names is None:
        return []
    issues: Issues = []
    if len(names) != cfg.num_nodes:
        issues.append(
            ConfigIssue(
                "node_resources",
                f"has {len(names)} name(s) for num_nodes={cfg.num_nodes}; give one per node",
            )
        )
    blank = [i for i, n in enumerate(names) if not n.strip()]
    if blank:
        issues.append(ConfigIssue("node_resources", f"entries {blank} are empty"))
    dups = sorted(n for n, k in Counter(names).items() if k > 1)
    if dups:
        issues.append(ConfigIssue("node_resources", f"names {dups} appear more than once"))
    return issues


def check_devices(cfg: ExperimentConfig) -> Issues:
    """device_mapping ids exist, are unique per role and split evenly into workers."""
    issues: Issues = check_node_resources(cfg)
    total = cfg.total_devices
    for role, worker in cfg.workers().items():
        path = f"{role}.device_mapping"
        is_train = (
            worker.strategy_args is not None
            and worker.strategy_args.strategy_name in (TRAIN_STRATEGIES)
            and role in TRAIN_ROLES
        )
        if is_train and worker.num_gpus_per_worker != 1:
            issues.append(
                ConfigIssue(
                    f"{role}.num_gpus_per_worker",
                    f"is {worker.num_gpus_per_worker}, but training workers use one device each; "
                    "remove it (it applies to inference workers only)",
                )
            )
        mapping = worker.device_mapping
        if mapping is None:
            continue
        if not mapping:
            issues.append(ConfigIssue(path, "is empty; list device ids or remove it to run on CPU"))
            continue
        bad = sorted({d for d in mapping if d < 0 or d >= total})
        if bad:
            issues.append(
                ConfigIssue(
                    path,
                    f"device ids {bad} are outside the {total} declared devices (0..{total - 1} = "
                    f"num_nodes {cfg.num_nodes} × num_gpus_per_node {cfg.num_gpus_per_node}); "
                    "raise num_gpus_per_node/num_nodes or use smaller ids",
                )
            )
        dups = sorted(d for d, n in Counter(mapping).items() if n > 1)
        if dups:
            issues.append(ConfigIssue(path, f"lists device ids {dups} more than once"))
        if len(mapping) % worker.num_gpus_per_worker:
            issues.append(
                ConfigIssue(
                    path,
                    f"has {len(mapping)} devices, not divisible by num_gpus_per_worker="
                    f"{worker.num_gpus_per_worker} (vllm: tensor_parallel_size × "
                    "pipeline_parallel_size)",
                )
            )
        elif worker.world_size != len(mapping) // worker.num_gpus_per_worker:
            issues.append(
                ConfigIssue(
                    f"{role}.world_size",
                    f"is {worker.world_size} but device_mapping gives "
                    f"{len(mapping) // worker.num_gpus_per_worker} workers; remove world_size",
                )
            )
    return issues


def check_batches(cfg: ExperimentConfig) -> Issues:
    """Each training rank gets whole micro-batches of the step's samples.

    Not for DPO configs: their batch is per_device_train_batch_size × accumulation × ranks."""
    issues: Issues = []
    if cfg.pipeline_kind in OFFLINE_PIPELINES:
        return issues
    samples = cfg.samples_per_step
    unit = (
        f"rollout_batch_size {cfg.rollout_batch_size} trajectories"
        if cfg.is_agentic
        else f"rollout_batch_size {cfg.rollout_batch_size} prompts × "
        f"num_return_sequences_in_group {cfg.num_return_sequences_in_group}"
    )
    for role, worker in cfg.workers().items():
        if role not in TRAIN_ROLES:
            continue
        micro = worker.training_args.per_device_train_batch_size
        world = worker.world_size or 1
        per_round = micro * world
        if samples % per_round:
            good = per_round * max(1, round(samples / per_round))
            issues.append(
                ConfigIssue(
                    f"{role}.training_args.per_device_train_batch_size",
                    f"{samples} samples per step ({unit}) do not split into micro-batches of "
                    f"{micro} on {world} rank(s) ({per_round} samples per round); make the samples "
                    f"per step a multiple of {per_round} (e.g. {good}) or change "
                    "per_device_train_batch_size",
                )
            )
    return issues


def _generating_args(cfg: ExperimentConfig) -> GeneratingArgs | None:
    """actor_infer's sampling options, or None where nothing generates: a DPO run trains on a
    fixed dataset and ignores actor_infer (rl_config.contract.DPO_IGNORED), so its defaults
    (max_new_tokens 128) must not refuse e.g. a DPO sequence_length of 100."""
    return None if cfg.pipeline_kind in OFFLINE_PIPELINES else cfg.actor_infer.generating_args


def check_lengths(cfg: ExperimentConfig) -> Issues:
    """prompt/response/sequence lengths and per-turn budgets are consistent."""
    issues: Issues = []
    seq = cfg.sequence_length or 0
    if cfg.prompt_length is not None and cfg.response_length is not None:
        need = cfg.prompt_length + cfg.response_length
        if need > seq:
            issues.append(
                ConfigIssue(
                    "sequence_length",
                    f"is {seq} but prompt_length {cfg.prompt_length} + response_length "
                    f"{cfg.response_length} = {need}; raise sequence_length to {need} or remove it",
                )
            )
    for name in ("prompt_length", "response_length"):
        value = getattr(cfg, name)
        if value is not None and value >= seq:
            issues.append(ConfigIssue(name, f"is {value}, but sequence_length is only {seq}"))
    gen = _generating_args(cfg)
    if gen is not None:
        if gen.max_new_tokens >= seq:
            issues.append(
                ConfigIssue(
                    "actor_infer.generating_args.max_new_tokens",
                    f"is {gen.max_new_tokens} but sequence_length is {seq}; no room for the prompt",
                )
            )
        if cfg.response_length is not None and gen.max_new_tokens > cfg.response_length:
            issues.append(
                ConfigIssue(
                    "actor_infer.generating_args.max_new_tokens",
                    f"is {gen.max_new_tokens}, above response_length {cfg.response_length}; use "
                    "${response_length}",
                )
            )
        elif (
            cfg.pipeline_kind == "rlvr"
            and cfg.response_length is not None
            and gen.max_new_tokens < cfg.response_length
            and "max_new_tokens" in gen.model_fields_set
        ):
            # ROLL: response_length is the RLVR generation budget and max_new_tokens repeats it
            issues.append(
                ConfigIssue(
                    "actor_infer.generating_args.max_new_tokens",
                    f"is {gen.max_new_tokens}, below response_length {cfg.response_length}, "
                    "which is the RLVR generation budget; use ${response_length} (or lower "
                    "response_length)",
                )
            )
    for tag, env in cfg.custom_envs.items():
        if env.max_tokens_per_step >= seq:
            issues.append(
                ConfigIssue(
                    f"custom_envs.{tag}.max_tokens_per_step",
                    f"is {env.max_tokens_per_step} but sequence_length is {seq}",
                )
            )
    for role, worker in cfg.workers().items():
        for phase in ("train", "infer"):
            if getattr(worker, f"use_dynamic_batching_in_{phase}"):
                budget = getattr(worker, f"max_tokens_per_microbatch_in_{phase}")
                if budget < seq:
                    issues.append(
                        ConfigIssue(
                            f"{role}.max_tokens_per_microbatch_in_{phase}",
                            f"is {budget} but one sequence may have sequence_length={seq} tokens; "
                            f"set it to at least {seq} (e.g. {2 * seq})",
                        )
                    )
    return issues


def check_generation(cfg: ExperimentConfig) -> Issues:
    """Sampling options the engines implement."""
    issues: Issues = []
    gen = _generating_args(cfg)
    if gen is None:
        return issues
    if gen.num_beams != 1:
        issues.append(
            ConfigIssue(
                "actor_infer.generating_args.num_beams",
                f"is {gen.num_beams}; beam search is not supported, use 1",
            )
        )
    if cfg.is_agentic and gen.num_return_sequences != 1:
        issues.append(
            ConfigIssue(
                "actor_infer.generating_args.num_return_sequences",
                f"is {gen.num_return_sequences}; agentic rollouts sample one response per env "
                "step: use 1 and set train_env_manager.group_size for G trajectories per group",
            )
        )
    infer_cfg = (
        cfg.actor_infer.strategy_args.strategy_config if cfg.actor_infer.strategy_args else None
    )
    if infer_cfg:
        util = infer_cfg.get("gpu_memory_utilization")
        if util is not None and not (isinstance(util, int | float) and 0 < util <= 1):
            issues.append(
                ConfigIssue(
                    "actor_infer.strategy_args.strategy_config.gpu_memory_utilization",
                    f"is {util!r}; use a fraction in (0, 1]",
                )
            )
    return issues


def _check_env_manager(cfg: ExperimentConfig, name: str, manager: EnvManagerConfig) -> Issues:
    issues: Issues = []
    known = list(cfg.custom_envs)
    dups = sorted(t for t, n in Counter(manager.tags).items() if n > 1)
    if not manager.tags:
        issues.append(ConfigIssue(f"{name}.tags", "is empty; list at least one env tag"))
    if dups:
        issues.append(ConfigIssue(f"{name}.tags", f"lists {dups} more than once"))
    for i, tag in enumerate(manager.tags):
        if tag not in cfg.custom_envs:
            close = difflib.get_close_matches(tag, known, 1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            defined = ", ".join(known) if known else "none yet"
            issues.append(
                ConfigIssue(
                    f"{name}.tags[{i}]",
                    f"env tag '{tag}' is not defined in custom_envs; {hint}(defined: {defined}). "
                    f"Add `custom_envs: {{{tag}: ...}}` (the bundled ones come with defaults "
                    "`../config/traj_envs@_here_` and `${custom_env." + tag + "}`)",
                )
            )
    partition = manager.num_groups_partition
    if partition is not None:
        if len(partition) != len(manager.tags):
            issues.append(
                ConfigIssue(
                    f"{name}.num_groups_partition",
                    f"has {len(partition)} entries but tags has {len(manager.tags)}; give one "
                    "group count per tag",
                )
            )
        if sum(partition) != manager.num_env_groups:
            issues.append(
                ConfigIssue(
                    f"{name}.num_groups_partition",
                    f"sums to {sum(partition)} but num_env_groups is {manager.num_env_groups}; "
                    "make them equal",
                )
            )
        if any(n < 0 for n in partition):
            issues.append(ConfigIssue(f"{name}.num_groups_partition", "has negative group counts"))
    elif manager.tags and manager.num_env_groups < len(manager.tags):
        issues.append(
            ConfigIssue(
                f"{name}.num_env_groups",
                f"is {manager.num_env_groups}, fewer than the {len(manager.tags)} tags; some tags "
                "would get no group",
            )
        )
    batch = cfg.rollout_batch_size if name == "train_env_manager" else cfg.val_batch_size
    batch_key = "rollout_batch_size" if name == "train_env_manager" else "val_batch_size"
    if batch % manager.group_size:
        issues.append(
            ConfigIssue(
                batch_key,
                f"is {batch} trajectories, not a multiple of {name}.group_size "
                f"{manager.group_size}: groups would be split across steps",
            )
        )
    if manager.max_traj_per_env >= 0 and name == "train_env_manager":
        capacity = manager.max_traj_per_env * manager.num_env_groups * manager.group_size
        if capacity < batch:
            need = math.ceil(batch / (manager.num_env_groups * manager.group_size))
            issues.append(
                ConfigIssue(
                    f"{name}.max_traj_per_env",
                    f"is {manager.max_traj_per_env}: {manager.num_env_groups * manager.group_size} "
                    f"envs can give only {capacity} trajectories, fewer than {batch_key} {batch}; "
                    f"use at least {need} or -1",
                )
            )
    return issues


def check_agentic(cfg: ExperimentConfig) -> Issues:
    """Env managers refer to defined envs; partitions add up; templates use known fields."""
    issues: Issues = []
    for name in ("train_env_manager", "val_env_manager"):
        manager = getattr(cfg, name)
        if manager is not None:
            issues += _check_env_manager(cfg, name, manager)
    for tag, env in cfg.custom_envs.items():
        issues += _check_template(f"custom_envs.{tag}.agent_template", env.agent_template)[0]
    return issues


def _check_template(path: str, template: str | None) -> tuple[Issues, list[str]]:
    """Errors (unknown placeholders) and warnings (ROLL-only placeholders) of an agent template.

    Only ``agent_template`` is a format string; ``agent_system_template`` is used verbatim (as in
    ROLL), so braces in it (``\\boxed{}``) are text."""
    if template is None:
        return [], []
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as exc:
        return [ConfigIssue(path, f"bad template: {exc}")], []
    names = sorted({f.split(".")[0].split("[")[0] for f in fields} - TEMPLATE_FIELDS)
    roll_only = [n for n in names if n in ROLL_TEMPLATE_PLACEHOLDERS]
    unknown = [n for n in names if n not in ROLL_TEMPLATE_PLACEHOLDERS]
    warnings = [
        f"{path}: placeholder {{{n}}} is not supported ({ROLL_TEMPLATE_PLACEHOLDERS[n]})"
        for n in roll_only
    ]
    if not unknown:
        return [], warnings
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(TEMPLATE_FIELDS), 1)
        hints.append(f"{{{name}}}" + (f" (did you mean {{{close[0]}}}?)" if close else ""))
    issue = ConfigIssue(
        path,
        f"uses unknown placeholders {', '.join(hints)}; allowed: {sorted(TEMPLATE_FIELDS)} "
        "(write literal braces as {{ }})",
    )
    return [issue], warnings


def check_algorithm(cfg: ExperimentConfig) -> Issues:
    """Algorithm knobs that need each other."""
    issues: Issues = []
    if cfg.adv_estimator == "gae" and cfg.critic is None:
        issues.append(
            ConfigIssue(
                "adv_estimator",
                "is 'gae', which needs value estimates: add a `critic:` worker or use a "
                "critic-free estimator such as grpo",
            )
        )
    method = cfg.reward_normalization.method
    if cfg.adv_estimator in STD_FREE_ESTIMATORS and method in STD_SCALING_METHODS:
        written = "reward_normalization" in cfg.model_fields_set and (
            "method" in cfg.reward_normalization.model_fields_set
        )
        issues.append(
            ConfigIssue(
                "reward_normalization.method",
                f"is {method!r}{'' if written else ' (the default)'}, which divides the rewards "
                f"by their group's std before adv_estimator {cfg.adv_estimator!r}, an estimator "
                "defined on raw rewards with its own baseline (with it dr_grpo would be exactly "
                "grpo): set reward_normalization.method: identity",
            )
        )
    for key in ("kl_penalty", "kl_loss_type"):
        if getattr(cfg, key) == "full":
            issues.append(
                ConfigIssue(
                    key,
                    "is 'full' (the exact KL over the vocabulary), which needs the reference's "
                    "logits [B, T, V] in the train step; the reference worker gives the "
                    "log-probs of the sampled tokens only: use k1, k2, k3 or abs",
                )
            )
    if cfg.difficulty_mask and cfg.difficulty_low_threshold >= cfg.difficulty_high_threshold:
        issues.append(
            ConfigIssue(
                "difficulty_low_threshold",
                f"{cfg.difficulty_low_threshold} must be below difficulty_high_threshold "
                f"{cfg.difficulty_high_threshold}: no group's mean score would be trained on",
            )
        )
    if cfg.adaptive_kl_ctrl and cfg.target_kl is None:
        issues.append(
            ConfigIssue("target_kl", "must be set when adaptive_kl_ctrl is true (e.g. 0.1)")
        )
    if cfg.use_pg_clip_range and (cfg.pg_clip_low is None or cfg.pg_clip_high is None):
        issues.append(
            ConfigIssue(
                "use_pg_clip_range",
                "is true, so set both pg_clip_low and pg_clip_high (e.g. 0.2 and 0.28)",
            )
        )
    for i, rule in enumerate(cfg.train_infer_correction.filters):
        if rule.ratio_low >= rule.ratio_high:
            issues.append(
                ConfigIssue(
                    f"train_infer_correction.filters[{i}]",
                    f"ratio_low {rule.ratio_low} must be below ratio_high {rule.ratio_high}",
                )
            )
    for role, worker in cfg.workers().items():
        if worker.data_args.prompt is not None and worker.data_args.messages is not None:
            issues.append(
                ConfigIssue(
                    f"{role}.data_args.messages",
                    "prompt and messages are mutually exclusive; keep one",
                )
            )
    return issues


def _unread_warmup(role: str, worker: WorkerConfig) -> list[tuple[str, str]]:
    """``(key, message)`` per warmup key set (non-zero) under the constant schedule."""
    args = worker.training_args
    if args.lr_scheduler_type != "constant":
        return []
    prefix = f"{role}.training_args"
    return [
        (
            f"{prefix}.{key}",
            f"is {getattr(args, key)} but {prefix}.lr_scheduler_type constant has no warmup; "
            f"use constant_with_warmup (or linear, cosine), or remove {key}",
        )
        for key in ("warmup_steps", "warmup_ratio")
        if getattr(args, key)
    ]


FLOORED_SCHEDULES = ("linear", "cosine", "cosine_with_min_lr")
"""Schedules that decay to a floor, so read lr_scheduler_kwargs.min_lr_rate / min_lr."""


def check_lr_schedules(cfg: ExperimentConfig) -> Issues:
    """Warmup and decay-floor keys are read by the chosen lr_scheduler_type: ``constant`` has no
    warmup, and neither constant schedule decays to a floor (keys at their default 0 pass)."""
    issues: Issues = []
    for role, worker in cfg.workers().items():
        if role not in TRAIN_ROLES:
            continue
        args = worker.training_args
        name = args.lr_scheduler_type
        prefix = f"{role}.training_args"
        if name == "constant" and "lr_scheduler_type" in args.model_fields_set:
            issues += [ConfigIssue(k, m) for k, m in _unread_warmup(role, worker)]
        if name in FLOORED_SCHEDULES:
            continue
        for key in ("min_lr_rate", "min_lr"):
            if (args.lr_scheduler_kwargs or {}).get(key, 0):
                issues.append(
                    ConfigIssue(
                        f"{prefix}.lr_scheduler_kwargs.{key}",
                        f"is {args.lr_scheduler_kwargs[key]} but {prefix}.lr_scheduler_type "
                        f"{name} does not decay; use {_or_list(FLOORED_SCHEDULES)}, or remove "
                        f"{key}",
                    )
                )
    return issues


#: why asynchronous training refuses roles on actor_infer's devices (config check, compose and
#: the runtime's own guard all say it)
ASYNC_COLOCATION = (
    "asynchronous training generates while the other roles run, and colocated engines would be "
    "put to sleep mid-generation; give actor_infer its own devices"
)


def shared_with_infer(cfg: ExperimentConfig, unset: tuple[int, ...] = ()) -> dict[str, list[int]]:
    """The roles whose devices overlap actor_infer's, with the devices shared (a role without a
    device_mapping counts as on ``unset``: none for the config check, where placement is not
    decided yet; device 0 for compose, which places it there)."""
    infer = set(cfg.actor_infer.device_mapping or unset)
    found = {}
    for role, worker in cfg.workers().items():
        shared = sorted(infer & set(worker.device_mapping or unset))
        if role != "actor_infer" and shared:
            found[role] = shared
    return found


def check_async(cfg: ExperimentConfig) -> Issues:
    """Async bounds are consistent and rollout has its own devices."""
    issues: Issues = []
    staleness = cfg.async_.max_staleness or 0
    ratio_need = math.ceil(cfg.async_generation_ratio)
    if staleness < ratio_need:
        issues.append(
            ConfigIssue(
                "async.max_staleness",
                f"is {staleness} weight versions, but async_generation_ratio "
                f"{cfg.async_generation_ratio} lets rollout run {ratio_need} step(s) ahead, so "
                f"those samples would be dropped; set max_staleness >= {ratio_need}",
            )
        )
    if staleness > 0:
        if cfg.generate_opt_level != 1:
            issues.append(
                ConfigIssue(
                    "generate_opt_level",
                    "must be 1 (request scheduler) for asynchronous training",
                )
            )
        for role, shared in shared_with_infer(cfg).items():
            partial = role == "actor_train" and set(shared) == set(
                cfg.actor_train.device_mapping or []
            )
            issues.append(
                ConfigIssue(
                    "actor_infer.device_mapping",
                    f"shares devices {shared} with {role}; {ASYNC_COLOCATION}"
                    + (
                        " (ROLL's partial-GPU mode, actor_train's devices a subset of "
                        "actor_infer's, is not implemented)"
                        if partial
                        else ""
                    ),
                )
            )
    elif cfg.async_.partial_rollout:
        issues.append(
            ConfigIssue(
                "async.partial_rollout",
                "needs asynchronous training: set async.max_staleness >= 1 or "
                "async_generation_ratio > 0",
            )
        )
    return issues


def check_preference_columns(cfg: ExperimentConfig) -> Issues:
    """The preference row's columns are distinct: one column cannot hold both the chosen and
    the rejected response (the pairs would be identical), nor a KTO label and a response."""
    issues: Issues = []
    if cfg.chosen_key == cfg.rejected_key:
        issues.append(
            ConfigIssue(
                "rejected_key",
                f"is {cfg.rejected_key!r}, the same column as chosen_key={cfg.chosen_key!r}: "
                "each preference pair needs its chosen and its rejected response in two "
                "different columns",
            )
        )
    responses = {"chosen_key": cfg.chosen_key, "rejected_key": cfg.rejected_key,
                 "completion_key": cfg.completion_key}  # fmt: skip
    for key, column in responses.items():
        if cfg.label_key == column:
            issues.append(
                ConfigIssue(
                    "label_key",
                    f"is {column!r}, the same column as {key}: the KTO label (true/false) and "
                    "a response need different columns",
                )
            )
    return issues


RULES: tuple[Callable[[ExperimentConfig], Issues], ...] = (
    check_strategies,
    check_fsdp2_options,
    check_remote_code,
    check_model_paths,
    check_devices,
    check_batches,
    check_lengths,
    check_generation,
    check_agentic,
    check_algorithm,
    check_lr_schedules,
    check_async,
    check_preference_columns,
)


def check_rules(cfg: ExperimentConfig) -> Issues:
    """All cross-field errors of a derived config (empty when valid)."""
    issues: Issues = []
    for rule in RULES:
        issues += rule(cfg)
    return issues


def _switched_off(cfg: ExperimentConfig) -> list[str]:
    """Loss keys set (off their default) whose switch selects the other key: pg_clip_low /
    pg_clip_high without use_pg_clip_range, pg_clip with it, dual_clip_c without dual_clip_loss,
    the difficulty thresholds without difficulty_mask."""
    fields = type(cfg).model_fields
    range_keys = ("pg_clip_low", "pg_clip_high")
    unread = [
        (key, "use_pg_clip_range", cfg.use_pg_clip_range)
        for key in (("pg_clip",) if cfg.use_pg_clip_range else range_keys)
    ]
    if not cfg.dual_clip_loss:
        unread.append(("dual_clip_c", "dual_clip_loss", False))
    if not cfg.difficulty_mask:
        unread += [(key, "difficulty_mask", False)
                   for key in ("difficulty_low_threshold", "difficulty_high_threshold")]  # fmt: skip
    return [
        f"{key}={getattr(cfg, key)!r} has no effect: {switch} is {str(on).lower()}"
        + (" (the clip range is pg_clip_low/pg_clip_high)" if key == "pg_clip" else "")
        for key, switch, on in unread
        if getattr(cfg, key) != fields[key].default
    ]


def collect_warnings(cfg: ExperimentConfig) -> list[str]:
    """Legal but likely unintended settings."""
    out: list[str] = []
    for tag, env in cfg.custom_envs.items():
        out += _check_template(f"custom_envs.{tag}.agent_template", env.agent_template)[1]
    from rl_config.contract import contract_issues, pipeline_kind

    rl = pipeline_kind(cfg) not in OFFLINE_PIPELINES  # their batch is their own (no rollout)
    samples = cfg.samples_per_step
    for role, worker in cfg.workers().items():
        if role not in TRAIN_ROLES or not rl:
            continue
        args = worker.training_args
        world = worker.world_size or 1
        opt_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
        if samples < opt_batch:
            out.append(
                f"{role}: one optimizer step needs {opt_batch} samples (per_device_train_batch_size "
                f"{args.per_device_train_batch_size} × gradient_accumulation_steps "
                f"{args.gradient_accumulation_steps} × world_size {world}) but a pipeline step has "
                f"{samples}; the optimizer steps less than once per pipeline step"
            )
        elif samples % opt_batch:
            out.append(
                f"{role}: {samples} samples per step are not a whole number of optimizer steps of "
                f"{opt_batch} samples; the last accumulation is partial"
            )
    if rl and cfg.adv_estimator in ("grpo", "rloo", "grpo_passk", "opo", "gpg"):
        if cfg.is_agentic and cfg.train_env_manager is not None:
            if cfg.train_env_manager.group_size == 1 and cfg.reward_normalization.grouping in (
                "traj_group_id",
                "state",
            ):
                out.append(
                    f"adv_estimator {cfg.adv_estimator} with train_env_manager.group_size 1 and "
                    "reward_normalization.grouping traj_group_id: every group has one trajectory, "
                    "so group-normalised advantages are 0; raise group_size or group by tags/batch"
                )
        elif not cfg.is_agentic and cfg.num_return_sequences_in_group == 1:
            out.append(
                f"adv_estimator {cfg.adv_estimator} with num_return_sequences_in_group 1: groups "
                "of one sample give zero advantages"
            )
    if rl:
        out += _switched_off(cfg)
    if cfg.kl_loss_coef > 0 and not cfg.use_kl_loss:
        out.append("kl_loss_coef is set but use_kl_loss is false; the KL loss is off")
    if cfg.use_kl_loss and cfg.kl_loss_coef == 0:
        out.append("use_kl_loss is true but kl_loss_coef is 0; the KL loss has no effect")
    if cfg.critic is not None and cfg.adv_estimator != "gae":
        out.append(f"a critic is configured but adv_estimator {cfg.adv_estimator} does not use it")
    for role, worker in cfg.workers().items():
        # an explicit `lr_scheduler_type: constant` with warmup is an error (check_lr_schedules);
        # under the default one (as many ROLL examples write warmup_steps) a warning
        if role in TRAIN_ROLES and "lr_scheduler_type" not in worker.training_args.model_fields_set:
            out += [
                f"{key}: {message} (constant is the default lr_scheduler_type)"
                for key, message in _unread_warmup(role, worker)
            ]
    if cfg.is_agentic and cfg.eval_steps > 0 and cfg.val_env_manager is None:
        out.append("eval_steps > 0 but no val_env_manager: validation is skipped")

    out += deepspeed_overrides(cfg)
    errors, ignored = contract_issues(cfg)
    out += [f"{key}: {message} (the runtime refuses this config)" for key, message in errors]
    return out + ignored
