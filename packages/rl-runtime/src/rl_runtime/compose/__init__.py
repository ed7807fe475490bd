"""Config -> components: the only reader of an `ExperimentConfig` outside rl-config, one module per concern
(roles, losses, advantage + KL, sampling, envs; `components` is the record they fill).

Pure: no I/O, Ray or model loading. `compose(cfg, device_kind=...)` returns a frozen `Components`
record of typed part configs, one `build_<part>` per part, each resolving names through the
packages' registries (a bad name fails here, in `--dry-run`, not inside a Ray actor). ROLL aliases
(`pg_clip`, grouping `state`, `fa2`) are resolved once, here. Runtime values (the model path after
the tiny-model build, the pad token) are arguments of `role_specs`, never fields.

Every schema field is either read here or declared in `rl_config.contract` (unsupported or
ignored); tests trace the reads of `compose` and check both directions.
"""

from __future__ import annotations

from typing import Any

from rl_runtime.compose.advantage import build_advantage, build_kl, unread_estimator_keys
from rl_runtime.compose.async_plan import AsyncPlan, build_async
from rl_runtime.compose.components import (
    AgentPlan,
    Cadence,
    CheckpointSettings,
    ClusterSettings,
    Components,
    EnvManagerPlan,
    EnvSpec,
    RolePlan,
    RunComponents,
    TrackerSettings,
)
from rl_runtime.compose.envs import build_env_manager, build_env_specs
from rl_runtime.compose.lora import reference_from_actor
from rl_runtime.compose.losses import (
    build_actor_loss,
    build_critic_loss,
    build_is_correction,
    loss_norm_constant,
)
from rl_runtime.compose.roles import build_role, role_specs
from rl_runtime.compose.run_settings import (
    build_cadence,
    build_checkpoint,
    build_cluster,
    build_tracker,
)
from rl_runtime.compose.sampling import build_sampling

__all__ = [
    "AgentPlan",
    "AsyncPlan",
    "Cadence",
    "CheckpointSettings",
    "ClusterSettings",
    "Components",
    "EnvManagerPlan",
    "EnvSpec",
    "RolePlan",
    "RunComponents",
    "TrackerSettings",
    "build_actor_loss",
    "build_advantage",
    "build_async",
    "build_critic_loss",
    "build_env_manager",
    "build_env_specs",
    "build_is_correction",
    "build_kl",
    "build_role",
    "build_sampling",
    "compose",
    "describe",
    "loss_norm_constant",
    "refuse_unsupported",
    "role_specs",
]


def compose(
    cfg: Any,
    *,
    device_kind: str = "cpu",
    flash_attn_available: bool = False,
    rollout_only: bool = False,
    pipeline: str | None = None,
) -> Components:
    """The components of `cfg` (a validated `ExperimentConfig`), for `device_kind`.

    Raises `ConfigError` naming every key set to a value rl_config.contract declares unsupported
    for `pipeline` (the app's kind: agentic, rlvr, dpo; default: inferred from the config's
    sections); `cfg.__wrapped__`, when present, is the config behind a proxy."""
    from rl_config.contract import pipeline_kind

    plain = getattr(cfg, "__wrapped__", cfg)
    refuse_unsupported(plain, pipeline)
    warnings: list[str] = []
    kind = pipeline or pipeline_kind(plain)
    samples = (
        cfg.rollout_batch_size
    )  # RLVR: prompts, each sampled num_return_sequences_in_group times
    if kind == "rlvr":
        samples *= cfg.num_return_sequences_in_group
    gen = cfg.actor_infer.generating_args
    max_new = min(gen.max_new_tokens, cfg.max_tokens_per_step or gen.max_new_tokens)
    names = ["actor_infer"]
    kl = build_kl(cfg)
    if not rollout_only:
        names.append("actor_train")
        if (cfg.init_kl_coef > 0 or cfg.use_kl_loss) and not reference_from_actor(cfg):
            names.append("reference")
        elif cfg.init_kl_coef > 0 or cfg.use_kl_loss:
            warnings.append(
                "reference: actor_train trains LoRA on the reference's model, so the reference "
                "log-probs come from actor_train with its adapter disabled; no reference worker "
                "starts (the reference section's placement and strategy are unused)"
            )
        if cfg.critic is not None:
            names.append("critic")
    norm = (  # Dr.GRPO's fixed denominator; the other modes have none
        loss_norm_constant(cfg, kind, max_new)
        if cfg.loss_agg_mode == "seq-mean-token-sum-norm"
        else None
    )
    roles = tuple(
        build_role(cfg, r, samples, device_kind, flash_attn_available, warnings, norm_constant=norm)
        for r in names
    )
    if kl.init_coef > 0 and not kl.in_reward and not cfg.use_kl_loss:
        warnings.append(
            "init_kl_coef > 0 without add_token_level_kl or use_kl_loss: no KL term is applied "
            "(set add_token_level_kl: true for a reward KL penalty)"
        )
    advantage = build_advantage(cfg)
    warnings += unread_estimator_keys(plain)
    if "values" in advantage.needs and cfg.critic is None and not rollout_only:
        raise ValueError(f"adv_estimator={cfg.adv_estimator} needs a critic section")
    actor = next((r for r in roles if r.role == "actor_train"), None)
    opt_steps = actor.training_args.max_steps if actor and actor.training_args else 0
    train = build_env_manager(cfg.train_env_manager, samples)
    val = build_env_manager(cfg.val_env_manager, None)
    asynchronous = None if rollout_only else build_async(cfg, samples, warnings)
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
        cadence=build_cadence(cfg),
        checkpoint=build_checkpoint(cfg),
        tracker=build_tracker(cfg, warnings),
        cluster=build_cluster(
            cfg, sync_bucket_bytes=int(cfg.model_update_buffer_size_mb) * 1024**2
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
        asynchronous=asynchronous,
        reference_from_actor=(
            not rollout_only
            and (cfg.init_kl_coef > 0 or cfg.use_kl_loss)
            and "reference" not in names
        ),
    )


def refuse_unsupported(cfg: Any, pipeline: str | None = None) -> None:
    from rl_config.contract import contract_issues
    from rl_config.errors import ConfigError, ConfigIssue

    errors, _ = contract_issues(cfg, pipeline)
    if errors:
        raise ConfigError([ConfigIssue(key, message) for key, message in errors])


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
