"""Roles: devices, backend, model args, optimiser schedule and loss per worker; `RoleSpec`s for the cluster."""

from __future__ import annotations

import math
from typing import Any

from rl_runtime.compose.components import BACKEND_ROLE, Components, RolePlan
from rl_runtime.compose.lora import (
    build_lora,
    engine_lora_options,
    sync_adapter_only,
)
from rl_runtime.compose.losses import build_actor_loss, build_critic_loss
from rl_runtime.compose.sampling import build_sampling
from rl_train.args import LogprobSampling, ModelArgs, TrainingArgs, parse_prefixes

DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def attn_implementation(
    requested: str | None,
    key: str,
    device_kind: str,
    dtype: str,
    flash_attn: bool,
    warnings: list[str],
) -> str | None:
    """The attention kernel for this device and compute dtype, decided by rl-train's
    `resolve_attn_implementation` (fa2 only where flash-attn imports on CUDA, else the varlen kernel
    on CUDA or sdpa, with a warning naming `key`); unset: the backend's choice (`auto`)."""
    import warnings as py_warnings

    from rl_train.attention import resolve_attn_implementation

    if requested is None:
        return None
    with py_warnings.catch_warnings(record=True) as caught:
        py_warnings.simplefilter("always")
        chosen = resolve_attn_implementation(
            requested, device_kind, dtype, key=key, flash_attn=flash_attn
        )
    warnings.extend(str(w.message) for w in caught)
    return chosen


def needs_sum_pi_squared(cfg: Any) -> bool:
    """Whether the advantage estimator (`adv_estimator`) reads the actor's `sum_pi_squared`
    (rl_algos.estimate.estimator_needs: optimal_token_baseline)."""
    from rl_algos.estimate import estimator_needs

    estimator = getattr(cfg, "adv_estimator", None)
    return estimator is not None and "sum_pi_squared" in estimator_needs(estimator)


def check_sum_pi_squared(
    strategy_config: dict[str, Any], sampling: Any, warnings: list[str]
) -> None:
    """The actor's forward computes `sum_pi_squared` from its logits: the fused log-prob head
    (which never forms them) is turned off, with a warning, unless the config turns it on (an
    error naming the key); a top-k/top-p truncated distribution is an error."""
    key = "actor_train.strategy_args.strategy_config.fused_lm_head"
    why = "adv_estimator=optimal_token_baseline reads sum_pi_squared from the actor's logits"
    if strategy_config.get("fused_lm_head") is True:
        raise ValueError(f"{key}: true, but {why}: set it false")
    if "fused_lm_head" not in strategy_config:
        strategy_config["fused_lm_head"] = False
        warnings.append(f"{key}: false ({why}; the [N, V] logits are formed)")
    if sampling.top_k is not None or sampling.top_p is not None:
        raise ValueError(
            f"{why}, of the sampling distribution: top-k/top-p truncation (generating_args) is "
            "not implemented for it"
        )


def shared_prompt_forward(w: Any, role: str, model_args: ModelArgs) -> bool:
    """`<role>.share_prompt_forward`, refused (naming the key) where rl-train's shared-prompt
    forward cannot run: a packed forward or an attention kernel other than sdpa/eager."""
    from rl_train.shared_prefix import SHARED_PROMPT_ATTENTION

    if not w.share_prompt_forward:
        return False
    key = f"{role}.share_prompt_forward"
    options = w.strategy_args.strategy_config or {}
    if options.get("packed_forward"):
        raise ValueError(
            f"{key}: cannot be combined with {role}.strategy_args.strategy_config.packed_forward "
            "(the shared-prompt forward runs padded micro-batches)"
        )
    if model_args.attn_implementation not in SHARED_PROMPT_ATTENTION:
        raise ValueError(
            f"{key}: needs attn_implementation sdpa or eager; {role} would run "
            f"{model_args.attn_implementation!r} (set {role}.model_args.attn_implementation: sdpa)"
        )
    return True


def optimizer_steps_per_step(samples: int, targs: Any, world_size: int, ppo_epochs: int) -> int:
    per_step = targs.per_device_train_batch_size * targs.gradient_accumulation_steps * world_size
    return max(1, math.ceil(samples / per_step)) * ppo_epochs


def rollout_sampling_distribution(cfg: Any) -> LogprobSampling:
    """The distribution the rollout samples the policy from (`actor_infer.generating_args`:
    temperature, top-k, top-p), which the trainer's log-probs use too (verl's and TRL's rule for
    the temperature; the engines record log-probs of the truncated distribution, so the trainer
    truncates alike). Greedy decoding or no `actor_infer` section: the raw model; `top_k <= 0`
    and `top_p >= 1` are off."""
    gen = getattr(getattr(cfg, "actor_infer", None), "generating_args", None)
    if gen is None:
        return LogprobSampling()
    # build_sampling decides greedy (temperature 0) and "off" the way the rollout does
    sampling = build_sampling(gen, max_new_tokens=1)
    if sampling.temperature == 0:
        return LogprobSampling()
    return LogprobSampling(
        temperature=sampling.temperature,
        top_k=sampling.top_k if sampling.top_k > 0 else None,
        top_p=sampling.top_p if sampling.top_p < 1.0 else None,
    )


def rollout_log_prob_warnings(cfg: Any, logprobs_mode: str | None) -> list[str]:
    """Where the engine's recorded log-probs cannot match the trainer's, by key: vLLM's
    `raw_logprobs` at a temperature other than 1 or with top-k / top-p, and a repetition penalty
    (the engines record log-probs after it; the trainer does not reproduce it)."""
    gen = getattr(getattr(cfg, "actor_infer", None), "generating_args", None)
    if gen is None:
        return []
    out = []
    dist = rollout_sampling_distribution(cfg)
    if logprobs_mode == "raw_logprobs" and (dist.temperature != 1.0 or dist.truncates):
        out.append(
            "actor_infer.strategy_args.strategy_config.logprobs_mode=raw_logprobs: the "
            "engine records the raw temperature-1 log-probs while the trainer's are of the "
            f"sampling distribution (temperature {dist.temperature}, top_k {dist.top_k}, "
            f"top_p {dist.top_p}); the train-inference ratio then measures the sampling "
            "settings, not a mismatch"
        )
    penalty = build_sampling(gen, max_new_tokens=1).repetition_penalty
    if penalty != 1.0:
        out.append(
            f"actor_infer.generating_args.repetition_penalty={penalty}: the engine's log-probs "
            "are taken after the penalty, the trainer's without it; the train-inference ratio "
            "and the policy gradient see the difference"
        )
    return out


def build_role(
    cfg: Any,
    role: str,
    samples: int,
    device_kind: str,
    flash_attn: bool,
    warnings: list[str],
    *,
    ppo_epochs: int | None = None,
    with_loss: bool = True,
    norm_constant: float | None = None,
    logprob_sampling: LogprobSampling | None = None,
) -> RolePlan:
    """One role's plan. `ppo_epochs` overrides the config's (a pipeline without PPO epochs passes
    1); `with_loss=False` leaves the loss to the caller (e.g. a preference loss);
    `norm_constant`: the losses' `seq-mean-token-sum-norm` denominator (`loss_norm_constant`);
    `logprob_sampling`: the distribution of the actor's and reference's log-probs, by default
    the rollout's (`rollout_sampling_distribution`)."""
    w = getattr(cfg, role)
    epochs = cfg.ppo_epochs if ppo_epochs is None else ppo_epochs
    mapping = tuple(w.device_mapping or [0])
    # training workers use one device each (rl_config's rules refuse anything else)
    per_worker = 1 if role in ("actor_train", "critic") else w.num_gpus_per_worker
    sa = w.strategy_args
    strategy_config: dict[str, Any] = dict(sa.strategy_config or {})
    common = dict(
        role=role,
        device_mapping=mapping,
        devices_per_worker=per_worker,
        strategy_name=sa.strategy_name,
        strategy_config=strategy_config,
        model_path=w.model_args.model_name_or_path,
        dtype=DTYPE_NAMES[w.model_args.dtype],
        config_overrides=dict(w.model_args.model_config_kwargs),
    )
    if role == "actor_infer":
        if sa.strategy_name == "vllm":
            engine_lora_options(cfg, common["strategy_config"], warnings)
        check_engine_options(sa.strategy_name, common["strategy_config"])
        mode = common["strategy_config"].get("logprobs_mode")
        warnings.extend(rollout_log_prob_warnings(cfg, mode))
        return RolePlan(**common)  # type: ignore[arg-type]
    attn = attn_implementation(
        w.model_args.attn_implementation,
        f"{role}.model_args.attn_implementation",
        device_kind,
        w.model_args.dtype,
        flash_attn,
        warnings,
    )
    model_args = ModelArgs(
        lora=None if role == "reference" else build_lora(w.model_args, role),
        dtype=w.model_args.dtype,
        attn_implementation=attn or "sdpa",
        disable_gradient_checkpointing=(
            True if role == "reference" else w.model_args.disable_gradient_checkpointing
        ),
        freeze_module_prefix=(
            () if role == "reference" else parse_prefixes(w.model_args.freeze_module_prefix)
        ),
        config_overrides=dict(w.model_args.model_config_kwargs),
    )
    share_prompt = False if role == "critic" else shared_prompt_forward(w, role, model_args)
    sampling = rollout_sampling_distribution(cfg) if logprob_sampling is None else logprob_sampling
    sum_pi_squared = role == "actor_train" and needs_sum_pi_squared(cfg)
    if sum_pi_squared:
        check_sum_pi_squared(strategy_config, sampling, warnings)
    world = max(1, len(mapping) // per_worker)
    t = w.training_args
    training = None
    if role != "reference":
        kwargs = dict(t.lr_scheduler_kwargs or {})
        min_lr_ratio = float(kwargs.pop("min_lr_rate", 0.0))
        if "min_lr" in kwargs:
            min_lr_ratio = float(kwargs.pop("min_lr")) / t.learning_rate
        if kwargs:
            raise ValueError(
                f"{role}.training_args.lr_scheduler_kwargs: unsupported {sorted(kwargs)} "
                "(known: min_lr_rate, min_lr)"
            )
        steps = optimizer_steps_per_step(samples, t, world, epochs)
        training = TrainingArgs(
            learning_rate=t.learning_rate,
            weight_decay=t.weight_decay,
            adam_beta1=t.adam_beta1,
            adam_beta2=t.adam_beta2,
            adam_epsilon=t.adam_epsilon,
            lr_scheduler_type=t.lr_scheduler_type,
            warmup_steps=t.warmup_steps,
            warmup_ratio=t.warmup_ratio,
            min_lr_ratio=min_lr_ratio,
            max_steps=steps * cfg.max_steps,
            max_grad_norm=cfg.max_grad_norm,
            per_device_train_batch_size=t.per_device_train_batch_size,
            gradient_accumulation_steps=t.gradient_accumulation_steps,
            ppo_epochs=epochs,
            use_dynamic_batching=w.use_dynamic_batching_in_train,
            max_tokens_per_microbatch=w.max_tokens_per_microbatch_in_train or 4096,
            seed=cfg.seed,
            infer_batch_size=w.infer_batch_size,
            share_prompt_forward=share_prompt,
            logprob_sampling=sampling,
            sum_pi_squared=sum_pi_squared,
        )
    else:
        training = TrainingArgs(
            seed=cfg.seed,
            infer_batch_size=w.infer_batch_size,
            share_prompt_forward=share_prompt,
            logprob_sampling=sampling,
        )
    loss = None
    if not with_loss:
        pass
    elif role == "actor_train":
        loss = build_actor_loss(cfg, norm_constant, warnings)
    elif role == "critic":
        loss = build_critic_loss(cfg, norm_constant)
    return RolePlan(**common, training_args=training, model_args=model_args, loss=loss)  # type: ignore[arg-type]


def role_specs(components: Components, model_path: str, agent_mode: str = "lockstep") -> list:
    """`RoleSpec`s of the cluster, given the run's policy model path (runtime value)."""
    from rl_runtime.cluster.cluster import RoleSpec
    from rl_runtime.cluster.rollout_worker import RolloutWorker
    from rl_runtime.cluster.train_worker import TrainWorker
    from rl_runtime.run.model_source import resolve_model

    specs = []
    for r in components.roles:
        key = r.model_key if r.model_path else "pretrain"
        path = resolve_model(
            r.model_path or model_path, key=key, system_envs=components.cluster.system_envs
        )
        if r.reward is not None:  # a model reward's workers (rl_runtime.cluster.reward_workers)
            from rl_runtime.cluster.reward_workers import reward_role_spec

            specs.append(reward_role_spec(r, path, components.seed))
            continue
        if r.role == "actor_infer":
            kwargs: dict[str, Any] = dict(
                model_path=path,
                strategy_name=r.strategy_name,
                strategy_config=r.strategy_config,
                dtype=r.dtype,
                seed=components.seed,
                env_configs={
                    tag: {"env_type": s.env_type, "config": s.config}
                    for tag, s in components.env_specs.items()
                },
                agent_kwargs=dict(
                    max_tokens_per_step=components.agent.max_tokens_per_step,
                    max_running_requests=components.agent.max_running_requests,
                    max_sequence_length=components.agent.max_sequence_length,
                    mode=agent_mode,
                ),
                sandbox_allow_weak_isolation=components.sandbox_allow_weak_isolation,
                config_overrides=r.config_overrides,
            )
            specs.append(  # 2 calls at once: a weight sync can land during a rollout
                RoleSpec(
                    r.role,
                    RolloutWorker,
                    r.device_mapping,
                    kwargs,
                    r.devices_per_worker,
                    max_concurrency=2,
                )
            )
            continue
        kwargs = dict(
            role=r.backend or BACKEND_ROLE[r.role],
            sync_adapter_only=r.role == "actor_train" and sync_adapter_only(components),
            model_path=path,
            strategy_name=r.strategy_name,
            strategy_config=r.strategy_config,
            training_args=r.training_args,
            model_args=r.model_args,
            loss_config=r.loss,
            seed=components.seed,
        )
        specs.append(RoleSpec(r.role, TrainWorker, r.device_mapping, kwargs, r.devices_per_worker))
    return specs


def check_engine_options(strategy_name: str, strategy_config: dict[str, Any]) -> None:
    """The rollout engine refuses a strategy_config key it does not take (or, for vllm, a value
    of the wrong type) when it starts, in a rollout worker after Ray and the trainers; here it is
    a config error naming the key, before anything starts (the engine's own check, through
    `rl_rollout.registry.engine_option_problems`: vLLM need not be installed)."""
    from rl_config.errors import ConfigError, ConfigIssue
    from rl_rollout.registry import engine_option_problems

    problems = engine_option_problems(strategy_name, strategy_config)
    if problems:
        raise ConfigError(
            [
                ConfigIssue(f"actor_infer.strategy_args.strategy_config.{key}", why)
                for key, why in sorted(problems.items())
            ]
        )
