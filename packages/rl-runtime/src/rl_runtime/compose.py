"""Config -> components: the only reader of an `ExperimentConfig` outside rl-config.

Pure: no I/O, Ray or model loading. `compose(cfg, device_kind=...)` returns a frozen `Components`
record of typed part configs, one `build_<part>` per part, each resolving names through the
packages' registries (a bad name fails here, in `--dry-run`, not inside a Ray actor). ROLL aliases
(`pg_clip`, grouping `state`, `fa2`) are resolved once, here. Runtime values (the model path after
the tiny-model build, the pad token) are arguments of `role_specs`, never fields.

Every schema field is either read here or declared in `rl_config.contract` (unsupported or
ignored); tests trace the reads of `compose` and check both directions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from rl_config.records import SamplingParams
from rl_runtime.advantages import AdvantageConfig, KLControlConfig
from rl_train.args import ModelArgs, TrainingArgs
from rl_train.losses import ActorLossConfig, CriticLossConfig, ISFilterConfig, ISWeightConfig

DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
BACKEND_ROLE = {"actor_train": "actor", "critic": "critic", "reference": "reference"}
GROUPING_ALIASES = {"state": "traj_group_id"}
FLASH_ATTN = ("fa2", "flash_attention_2")


@dataclass(frozen=True)
class RolePlan:
    """One role: devices, backend, model and (training roles) optimiser, model args and loss."""

    role: str
    device_mapping: tuple[int, ...]
    devices_per_worker: int
    strategy_name: str
    strategy_config: dict[str, Any]
    model_path: str | None
    dtype: str
    training_args: TrainingArgs | None = None
    model_args: ModelArgs | None = None
    loss: ActorLossConfig | CriticLossConfig | None = None

    @property
    def trains(self) -> bool:
        return self.role in BACKEND_ROLE


@dataclass(frozen=True)
class EnvManagerPlan:
    """Which envs a split plays: tags, groups x group_size, episodes per step (train)."""

    tags: tuple[str, ...]
    num_env_groups: int
    group_size: int
    num_groups_partition: tuple[int, ...] | None
    num_episodes: int | None


@dataclass(frozen=True)
class EnvSpec:
    """One env definition by tag: registry type and constructor options."""

    env_type: str
    config: dict[str, Any]


@dataclass(frozen=True)
class AgentPlan:
    """AgentLoop options of the rollout workers."""

    max_tokens_per_step: int
    max_running_requests: int
    max_sequence_length: int


@dataclass(frozen=True)
class Cadence:
    max_steps: int
    logging_steps: int
    eval_steps: int
    save_steps: int


@dataclass(frozen=True)
class CheckpointSettings:
    directory: str
    keep_last: int | None
    resume: bool | str
    key_file: str | None  # signs/verifies manifests; None: rl_train.signing.default_key_file()


@dataclass(frozen=True)
class TrackerSettings:
    track_with: str
    log_dir: str
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class ClusterSettings:
    num_devices: int
    rpc_timeout: float
    system_envs: dict[str, str]
    sync_bucket_bytes: int


@dataclass(frozen=True)
class Components:
    """Everything a run is built from (see module docstring); `--dry-run` prints it."""

    exp_name: str
    seed: int
    output_dir: str
    render_dir: str | None
    pretrain: str | None
    roles: tuple[RolePlan, ...]
    advantage: AdvantageConfig
    kl: KLControlConfig
    base_sampling: SamplingParams
    train_envs: EnvManagerPlan | None
    val_envs: EnvManagerPlan | None
    env_specs: dict[str, EnvSpec]
    agent: AgentPlan
    sequence_length: int
    cadence: Cadence
    checkpoint: CheckpointSettings
    tracker: TrackerSettings
    cluster: ClusterSettings
    sizes: dict[str, int]
    max_failed_fraction: float = 0.5
    """Stop training when a batch has a larger share of failed episodes (rl_runtime.failures)."""
    sandbox_allow_weak_isolation: bool = False
    """Let untrusted reward/tool code run without network namespaces (rl-envs sandbox)."""
    warnings: tuple[str, ...] = field(default=())

    def role(self, name: str) -> RolePlan | None:
        return next((r for r in self.roles if r.role == name), None)

    def sampling(self, split: str, epoch: int, greedy: bool = False) -> SamplingParams:
        """Sampling of one rollout batch: the configured params (greedy when `greedy` or
        `do_sample: false`), a seed from (seed, epoch, split)."""
        seed = self.seed * 100_003 + epoch * 7 + (0 if split == "train" else 1)
        params = msgspec.structs.replace(self.base_sampling, seed=seed)
        if greedy:
            params = msgspec.structs.replace(params, temperature=0.0, top_p=1.0, top_k=-1)
        return params


# --------------------------------------------------------------------------------- builders
def build_actor_loss(cfg: Any) -> ActorLossConfig:
    """ROLL's algorithm keys -> ActorLossConfig (pg_clip, or pg_clip_low/high when
    use_pg_clip_range; dual_clip_c when dual_clip_loss; train_infer_correction)."""
    worker = cfg.actor_train
    name = worker.pg_variant or "ppo_clip"
    if cfg.use_pg_clip_range:
        low, high = cfg.pg_clip_low, cfg.pg_clip_high
    else:
        low = high = cfg.pg_clip
    weight, filters = build_is_correction(cfg.train_infer_correction)
    return ActorLossConfig(
        policy_loss=name,
        loss_agg_mode=cfg.loss_agg_mode,
        clip_ratio_low=float(low if low is not None else 0.2),
        clip_ratio_high=float(high if high is not None else 0.2),
        dual_clip_c=cfg.dual_clip_c if cfg.dual_clip_loss else None,
        rl_loss_coef=cfg.rl_loss_coef,
        use_kl_loss=cfg.use_kl_loss,
        kl_loss_coef=cfg.kl_loss_coef,
        kl_loss_type=cfg.kl_loss_type,
        entropy_loss_coef=cfg.entropy_loss_coef,
        is_weight=weight,
        is_filters=filters,
    )


def build_is_correction(tic: Any) -> tuple[ISWeightConfig | None, tuple[ISFilterConfig, ...]]:
    """train_infer_correction -> truncated IS weights and ratio filters."""

    def level(value: str, key: str) -> str:
        if value == "segment":
            raise ValueError(f"train_infer_correction.{key}: segment is not supported")
        return value

    iw = tic.is_weight
    weight = None
    if iw.enabled:
        bound = math.inf if iw.upper_bound is None else float(iw.upper_bound)
        weight = ISWeightConfig(
            level=level(iw.weight_type, "is_weight.weight_type"), upper_bound=bound
        )  # type: ignore[arg-type]
    filters = []
    for i, f in enumerate(tic.filters):
        if not f.enabled:
            continue
        if f.diff_enabled or not f.ratio_enabled:
            raise ValueError(
                f"train_infer_correction.filters[{i}]: only ratio filters are supported "
                "(diff_enabled: false, ratio_enabled: true)"
            )
        lvl = level(f.agg_type, f"filters[{i}].agg_type")
        filters.append(ISFilterConfig(level=lvl, low=f.ratio_low, high=f.ratio_high))  # type: ignore[arg-type]
    return weight, tuple(filters)


def build_critic_loss(cfg: Any) -> CriticLossConfig:
    return CriticLossConfig(value_clip=cfg.value_clip, loss_agg_mode=cfg.loss_agg_mode)


def build_advantage(cfg: Any) -> AdvantageConfig:
    rn = cfg.reward_normalization
    return AdvantageConfig(
        adv_estimator=cfg.adv_estimator,
        grouping=GROUPING_ALIASES.get(rn.grouping, rn.grouping),
        method=rn.method,
        gamma=cfg.gamma,
        lam=cfg.lambd,
        whiten_advantages=cfg.whiten_advantages,
        advantage_clip=cfg.advantage_clip,
        kl_kind=cfg.kl_penalty,
        gigpo_episode_weight=cfg.episode_reward_weight,
        gigpo_step_weight=cfg.step_reward_weight,
        gigpo_gamma=cfg.step_reward_gamma,
    )


def build_kl(cfg: Any) -> KLControlConfig:
    adaptive = (
        cfg.adaptive_kl_ctrl if cfg.adaptive_kl_ctrl is not None else cfg.target_kl is not None
    )
    if adaptive and cfg.target_kl is None:
        raise ValueError("adaptive_kl_ctrl: true needs target_kl")
    return KLControlConfig(
        in_reward=cfg.add_token_level_kl,
        init_coef=cfg.init_kl_coef,
        target=cfg.target_kl if adaptive else None,
        horizon=cfg.kl_horizon,
    )


def build_sampling(gen: Any, max_new_tokens: int) -> SamplingParams:
    """generating_args -> SamplingParams (do_sample: false = greedy; top_k 0 = off)."""
    greedy = not gen.do_sample or gen.temperature == 0
    return SamplingParams(
        temperature=0.0 if greedy else gen.temperature,
        top_p=1.0 if greedy else gen.top_p,
        top_k=-1 if greedy or gen.top_k <= 0 else gen.top_k,
        max_new_tokens=max_new_tokens,
        repetition_penalty=gen.repetition_penalty,
        stop=list(gen.stop_strings or []),
    )


def build_env_manager(mgr: Any, num_episodes: int | None) -> EnvManagerPlan | None:
    if mgr is None:
        return None
    part = mgr.num_groups_partition
    return EnvManagerPlan(
        tags=tuple(mgr.tags),
        num_env_groups=mgr.num_env_groups,
        group_size=mgr.group_size,
        num_groups_partition=tuple(part) if part is not None else None,
        num_episodes=num_episodes,
    )


def build_env_specs(custom_envs: Any) -> dict[str, EnvSpec]:
    """custom_envs -> EnvSpec per tag; `max_steps` (turns per episode) goes into the env's
    options, and must agree with an `env_config.max_steps` given there too."""
    out = {}
    for tag, env in custom_envs.items():
        config = dict(env.env_config or {})
        inner = config.setdefault("max_steps", env.max_steps)
        if inner != env.max_steps:
            raise ValueError(
                f"custom_envs.{tag}.max_steps={env.max_steps} disagrees with "
                f"custom_envs.{tag}.env_config.max_steps={inner}; set one of them"
            )
        out[tag] = EnvSpec(env_type=env.env_type, config=config)
    return out


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


def optimizer_steps_per_step(samples: int, targs: Any, world_size: int, ppo_epochs: int) -> int:
    per_step = targs.per_device_train_batch_size * targs.gradient_accumulation_steps * world_size
    return max(1, math.ceil(samples / per_step)) * ppo_epochs


def build_role(
    cfg: Any, role: str, samples: int, device_kind: str, flash_attn: bool, warnings: list[str]
) -> RolePlan:
    w = getattr(cfg, role)
    mapping = tuple(w.device_mapping or [0])
    # training workers use one device each (rl_config's rules refuse anything else)
    per_worker = 1 if role in ("actor_train", "critic") else w.num_gpus_per_worker
    sa = w.strategy_args
    common = dict(
        role=role,
        device_mapping=mapping,
        devices_per_worker=per_worker,
        strategy_name=sa.strategy_name,
        strategy_config=dict(sa.strategy_config or {}),
        model_path=w.model_args.model_name_or_path,
        dtype=DTYPE_NAMES[w.model_args.dtype],
    )
    if role == "actor_infer":
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
        dtype=w.model_args.dtype,
        attn_implementation=attn or "sdpa",
        disable_gradient_checkpointing=(
            True if role == "reference" else w.model_args.disable_gradient_checkpointing
        ),
    )
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
        steps = optimizer_steps_per_step(samples, t, world, cfg.ppo_epochs)
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
            ppo_epochs=cfg.ppo_epochs,
            use_dynamic_batching=w.use_dynamic_batching_in_train,
            max_tokens_per_microbatch=w.max_tokens_per_microbatch_in_train or 4096,
            seed=cfg.seed,
            infer_batch_size=w.infer_batch_size,
        )
    else:
        training = TrainingArgs(seed=cfg.seed, infer_batch_size=w.infer_batch_size)
    loss = None
    if role == "actor_train":
        loss = build_actor_loss(cfg)
    elif role == "critic":
        loss = build_critic_loss(cfg)
    return RolePlan(**common, training_args=training, model_args=model_args, loss=loss)  # type: ignore[arg-type]


def compose(
    cfg: Any,
    *,
    device_kind: str = "cpu",
    flash_attn_available: bool = False,
    rollout_only: bool = False,
) -> Components:
    """The components of `cfg` (a validated `ExperimentConfig`), for `device_kind`.

    Raises `ConfigError` naming every key set to a value rl_config.contract declares unsupported
    (`cfg.__wrapped__`, when present, is the config behind a proxy)."""
    refuse_unsupported(getattr(cfg, "__wrapped__", cfg))
    warnings: list[str] = []
    samples = cfg.rollout_batch_size
    gen = cfg.actor_infer.generating_args
    max_new = min(gen.max_new_tokens, cfg.max_tokens_per_step or gen.max_new_tokens)
    names = ["actor_infer"]
    kl = build_kl(cfg)
    if not rollout_only:
        names.append("actor_train")
        if cfg.init_kl_coef > 0 or cfg.use_kl_loss:
            names.append("reference")
        if cfg.critic is not None:
            names.append("critic")
    roles = tuple(
        build_role(cfg, r, samples, device_kind, flash_attn_available, warnings) for r in names
    )
    if kl.init_coef > 0 and not kl.in_reward and not cfg.use_kl_loss:
        warnings.append(
            "init_kl_coef > 0 without add_token_level_kl or use_kl_loss: no KL term is applied "
            "(set add_token_level_kl: true for a reward KL penalty)"
        )
    advantage = build_advantage(cfg)
    if "values" in advantage.needs and cfg.critic is None and not rollout_only:
        raise ValueError(f"adv_estimator={cfg.adv_estimator} needs a critic section")
    actor = next((r for r in roles if r.role == "actor_train"), None)
    opt_steps = actor.training_args.max_steps if actor and actor.training_args else 0
    train = build_env_manager(cfg.train_env_manager, samples)
    val = build_env_manager(cfg.val_env_manager, None)
    ckpt = cfg.checkpoint_config.output_dir or f"{cfg.output_dir.rstrip('/')}/checkpoints"
    return Components(
        exp_name=cfg.exp_name,
        seed=cfg.seed,
        output_dir=cfg.output_dir,
        render_dir=cfg.render_save_dir,
        pretrain=cfg.pretrain,
        roles=roles,
        advantage=advantage,
        kl=kl,
        base_sampling=build_sampling(gen, max_new),
        train_envs=train,
        val_envs=val,
        env_specs=build_env_specs(cfg.custom_envs),
        agent=AgentPlan(
            max_tokens_per_step=max_new,
            max_running_requests=cfg.max_running_requests,
            max_sequence_length=cfg.sequence_length,
        ),
        sequence_length=cfg.sequence_length,
        cadence=Cadence(
            max_steps=cfg.max_steps,
            logging_steps=cfg.logging_steps,
            eval_steps=cfg.eval_steps,
            save_steps=cfg.save_steps,
        ),
        checkpoint=CheckpointSettings(
            directory=ckpt,
            keep_last=cfg.max_ckpt_to_keep or None,
            resume=cfg.resume_from_checkpoint,
            key_file=cfg.checkpoint_config.key_file,
        ),
        tracker=TrackerSettings(
            track_with=cfg.track_with, log_dir=cfg.logging_dir, kwargs=dict(cfg.tracker_kwargs)
        ),
        cluster=ClusterSettings(
            num_devices=cfg.num_nodes * cfg.num_gpus_per_node,
            rpc_timeout=float(cfg.rpc_timeout),
            system_envs=dict(cfg.system_envs),
            sync_bucket_bytes=int(cfg.model_update_buffer_size_mb) * 1024**2,
        ),
        sizes={
            "samples_per_step": samples,
            "max_new_tokens": max_new,
            "optimizer_steps_total": opt_steps,
            "val_episodes": (val.num_env_groups * val.group_size) if val else 0,
        },
        max_failed_fraction=float(cfg.max_failed_fraction),
        sandbox_allow_weak_isolation=bool(cfg.sandbox_allow_weak_isolation),
        warnings=tuple(warnings),
    )


def refuse_unsupported(cfg: Any) -> None:
    from rl_config.contract import contract_issues
    from rl_config.errors import ConfigError, ConfigIssue

    errors, _ = contract_issues(cfg)
    if errors:
        raise ConfigError([ConfigIssue(key, message) for key, message in errors])


def role_specs(components: Components, model_path: str, agent_mode: str = "lockstep") -> list:
    """`RoleSpec`s of the cluster, given the run's policy model path (runtime value)."""
    from rl_runtime.cluster import RoleSpec
    from rl_runtime.workers import RolloutWorker, TrainWorker

    specs = []
    for r in components.roles:
        path = resolve_local(r.model_path or model_path)
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
            )
            specs.append(
                RoleSpec(r.role, RolloutWorker, r.device_mapping, kwargs, r.devices_per_worker)
            )
            continue
        kwargs = dict(
            role=BACKEND_ROLE[r.role],
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


def resolve_local(path: str) -> str:
    """An existing local path made absolute (Ray workers may run elsewhere); a hub id unchanged."""
    return str(Path(path).resolve()) if Path(path).exists() else path


def describe(components: Components) -> str:
    """The dry-run text: one line per role, then every component."""
    import pprint

    lines = [f"experiment {components.exp_name!r}"]
    for r in components.roles:
        lines.append(
            f"  {r.role:<12} strategy={r.strategy_name} devices={list(r.device_mapping)} "
            f"model={r.model_path} dtype={r.dtype}"
        )
    for name in components.__dataclass_fields__:
        text = pprint.pformat(getattr(components, name), width=98, sort_dicts=False)
        lines.append(f"{name}: " + text.replace("\n", "\n  "))
    return "\n".join(lines)
