"""verl's config keys and the ROLL keys of this stack that hold the same settings.

This stack reads ROLL's key names. A whole verl command or config file is translated with verl's
meaning by ``--verl`` / ``--verl-config`` (``rl_config.verl_translate``, whose per-key rules
start from this table). Without them, a verl user who passes verl's overrides
(``data.train_files=...``, ``critic.optim.lr=1e-5``) gets one error per verl key, each naming the
ROLL key to write instead or saying that there is none (``VERL_SECTIONS``), instead of a
misleading "did you mean" (``trainer`` -> ``pretrain``). A verl (Hydra) config file given as a
config is refused as a whole, before its defaults list is composed (``verl_file_issue``). Every
ROLL key named on the right is a schema key (a test checks).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any, NamedTuple

from rl_config.errors import ConfigIssue


class Counterpart(NamedTuple):
    """What a verl key becomes here: the ROLL keys that hold its setting (``()``: none) and a
    short note (how the keys combine, or why there is no counterpart)."""

    keys: tuple[str, ...]
    note: str = ""


def _to(*keys: str, note: str = "") -> Counterpart:
    return Counterpart(keys, note)


def _none(why: str) -> Counterpart:
    return Counterpart((), why)


_MEGATRON = _none("Megatron-LM is not implemented (FSDP2 or DeepSpeed: strategy_args)")
_FSDP2 = "fsdp2_train"
_VLLM = "vllm"
_RULES = (
    "verl's reward_model section has no counterpart key: a reward model is a rewards domain "
    "(reward_fn: reward_model); rule rewards are rewards and custom_reward_function"
)
_REWARD_MANAGER = (
    "rule rewards are the rewards section and custom_reward_function; DAPO's overlong penalty "
    "is overlong_penalty"
)
_EPOCHS = (
    "no epoch count: max_steps = epochs x prompts / rollout_batch_size; at an epoch's end the "
    "sampler reshuffles and goes on"
)
_MINI_BATCH = (
    "an optimizer step takes per_device_train_batch_size x gradient_accumulation_steps x ranks "
    "samples = ppo_mini_batch_size x rollout.n"
)


def _optim(role: str) -> dict[str, Counterpart]:
    """verl's ``optim`` block of an actor or critic -> ``<role>.training_args``."""
    args = f"{role}.training_args"
    return {
        "optim.lr": _to(f"{args}.learning_rate"),
        "optim.weight_decay": _to(f"{args}.weight_decay"),
        "optim.betas": _to(f"{args}.adam_beta1", f"{args}.adam_beta2"),
        "optim.lr_warmup_steps": _to(f"{args}.warmup_steps"),
        "optim.lr_warmup_steps_ratio": _to(f"{args}.warmup_ratio"),
        "optim.warmup_style": _to(f"{args}.lr_scheduler_type"),
        "optim.lr_scheduler_type": _to(f"{args}.lr_scheduler_type"),
        "optim.clip_grad": _to("max_grad_norm"),
        "optim.lr_decay_steps": _none("the schedule spans the run's optimizer steps"),
        "optim.lr_decay_style": _to(f"{args}.lr_scheduler_type"),
        "optim.override_optimizer_config": _none("Megatron optimizer options"),
    }


def _trainer_role(role: str) -> dict[str, Counterpart]:
    """verl's keys of a trained role (actor, critic) -> ``<role>.*``."""
    return {
        **_optim(role),
        "ppo_micro_batch_size_per_gpu": _to(f"{role}.training_args.per_device_train_batch_size"),
        "ppo_mini_batch_size": _to(
            f"{role}.training_args.gradient_accumulation_steps", note=_MINI_BATCH
        ),
        "ppo_epochs": _to("ppo_epochs"),
        "use_dynamic_bsz": _to(f"{role}.use_dynamic_batching_in_train"),
        "ppo_max_token_len_per_gpu": _to(f"{role}.max_tokens_per_microbatch_in_train"),
        "grad_clip": _to("max_grad_norm"),
        "strategy": _to(f"{role}.strategy_args.strategy_name", note="fsdp2: fsdp2_train"),
        "fsdp_config.param_offload": _to(
            f"{role}.strategy_args.strategy_config.cpu_offload", note=_FSDP2
        ),
        "fsdp_config.optimizer_offload": _to(
            f"{role}.strategy_args.strategy_config.cpu_offload", note=_FSDP2
        ),
        "fsdp_config.fsdp_size": _none("FSDP2 shards over all ranks of the role"),
        "ulysses_sequence_parallel_size": _none("Ulysses sequence parallelism is not implemented"),
        "megatron": _MEGATRON,
    }


_ACTOR = {f"actor.{k}": v for k, v in _trainer_role("actor_train").items()}
_REF = {
    "ref.log_prob_micro_batch_size_per_gpu": _to("reference.infer_batch_size"),
    "ref.fsdp_config.param_offload": _to(
        "reference.strategy_args.strategy_config.offload_reference", note=_FSDP2
    ),
    "ref.log_prob_use_dynamic_bsz": _none("forward passes are not dynamically batched"),
    "ref.log_prob_max_token_len_per_gpu": _none("forward passes are not dynamically batched"),
    "ref.ulysses_sequence_parallel_size": _none("Ulysses sequence parallelism is not implemented"),
    "ref.use_torch_compile": _none("no torch.compile switch for log-prob passes"),
    "ref.megatron": _MEGATRON,
}
_ENGINE = "actor_infer.strategy_args.strategy_config"
_ROLLOUT = {
    "rollout.n": _to("num_return_sequences_in_group"),
    "rollout.name": _to("actor_infer.strategy_args.strategy_name"),
    "rollout.temperature": _to("actor_infer.generating_args.temperature"),
    "rollout.top_p": _to("actor_infer.generating_args.top_p"),
    "rollout.top_k": _to("actor_infer.generating_args.top_k"),
    "rollout.do_sample": _to("actor_infer.generating_args.do_sample"),
    "rollout.prompt_length": _to("prompt_length"),
    "rollout.response_length": _to("response_length"),
    "rollout.gpu_memory_utilization": _to(f"{_ENGINE}.gpu_memory_utilization", note=_VLLM),
    "rollout.tensor_model_parallel_size": _to(f"{_ENGINE}.tensor_parallel_size", note=_VLLM),
    "rollout.max_num_batched_tokens": _to(f"{_ENGINE}.max_num_batched_tokens", note=_VLLM),
    "rollout.max_num_seqs": _to(f"{_ENGINE}.max_num_seqs", note=_VLLM),
    "rollout.max_model_len": _to(f"{_ENGINE}.max_model_len", note=_VLLM),
    "rollout.enforce_eager": _to(f"{_ENGINE}.enforce_eager", note=_VLLM),
    "rollout.enable_prefix_caching": _to(f"{_ENGINE}.enable_prefix_caching", note=_VLLM),
    "rollout.load_format": _to(f"{_ENGINE}.load_format", note=_VLLM),
    "rollout.enable_chunked_prefill": _to(f"{_ENGINE}.enable_chunked_prefill", note=_VLLM),
    "rollout.free_cache_engine": _to(
        f"{_ENGINE}.enable_sleep_mode", note="vllm; on by default where the platform has it"
    ),
    "rollout.log_prob_micro_batch_size_per_gpu": _to(
        "actor_train.infer_batch_size", note="old log-probs are computed by actor_train"
    ),
    "rollout.log_prob_use_dynamic_bsz": _none("forward passes are not dynamically batched"),
    "rollout.log_prob_max_token_len_per_gpu": _none("forward passes are not dynamically batched"),
    "rollout.mode": _none("one engine mode; off-policy training: async_generation_ratio"),
    "rollout.calculate_log_probs": _none("rollout log-probs are always recorded"),
    "rollout.val_kwargs.temperature": _to("validation.generating_args.temperature"),
    "rollout.val_kwargs.top_p": _to("validation.generating_args.top_p"),
    "rollout.val_kwargs.top_k": _to("validation.generating_args.top_k"),
    "rollout.val_kwargs.do_sample": _to("validation.generating_args.do_sample"),
    "rollout.val_kwargs.n": _to("val_n_sample"),
}
_MODEL = {
    "model.path": _to("pretrain"),
    "model.enable_gradient_checkpointing": _to(
        "actor_train.model_args.disable_gradient_checkpointing",
        note="inverted; checkpointing is on by default",
    ),
    "model.use_remove_padding": _to(
        "actor_train.strategy_args.strategy_config.packed_forward", note=_FSDP2
    ),
    "model.use_fused_kernels": _to(
        "actor_train.strategy_args.strategy_config.fused_lm_head", note=_FSDP2
    ),
    "model.override_config": _to(
        *(
            f"{r}.model_args.model_config_kwargs"
            for r in ("actor_train", "actor_infer", "reference")
        )
    ),
    "model.trust_remote_code": _none("remote model code is never run"),
    "model.lora_rank": _none("LoRA training is not implemented"),
    "model.lora_alpha": _none("LoRA training is not implemented"),
}

VERL_SECTIONS: dict[str, dict[str, Counterpart]] = {
    "data": {
        "train_files": _to("actor_train.data_args.file_name"),
        "val_files": _to("actor_train.data_args.eval_file_name"),
        "train_batch_size": _to("rollout_batch_size"),
        "val_batch_size": _to("val_batch_size"),
        "max_prompt_length": _to("prompt_length"),
        "max_response_length": _to("response_length"),
        "prompt_key": _to("actor_train.data_args.messages", note="its column of chat messages"),
        "seed": _to("seed"),
        "filter_overlong_prompts": _none(
            "prompts longer than prompt_length are dropped (and counted) unless "
            "prompt_truncation cuts them"
        ),
        "filter_overlong_prompts_workers": _none("the prompt filter runs in the driver"),
        "truncation": _to(
            "prompt_truncation", note="left, right or middle; verl's error drops the prompt here"
        ),
        "return_raw_chat": _none("the chat template is applied by the rollout package"),
    },
    "actor_rollout_ref": {
        **_MODEL,
        **_ACTOR,
        "actor.use_kl_loss": _to("use_kl_loss"),
        "actor.kl_loss_coef": _to("kl_loss_coef"),
        "actor.kl_loss_type": _to("kl_loss_type"),
        "actor.entropy_coeff": _to("entropy_loss_coef"),
        "actor.loss_agg_mode": _to("loss_agg_mode"),
        "actor.clip_ratio": _to("pg_clip"),
        "actor.clip_ratio_low": _to("pg_clip_low", "use_pg_clip_range"),
        "actor.clip_ratio_high": _to("pg_clip_high", "use_pg_clip_range"),
        "actor.clip_ratio_c": _to("dual_clip_c", "dual_clip_loss"),
        "actor.use_torch_compile": _none("no torch.compile switch for log-prob passes"),
        **_REF,
        **_ROLLOUT,
        "hybrid_engine": _none("colocation comes from device_mapping (shared devices)"),
        "nccl_timeout": _to("actor_train.backend_timeout", note="in minutes"),
    },
    "algorithm": {
        "adv_estimator": _to("adv_estimator"),
        "gamma": _to("gamma"),
        "lam": _to("lambd"),
        "use_kl_in_reward": _to("add_token_level_kl"),
        "kl_penalty": _to("kl_penalty"),
        "kl_ctrl.kl_coef": _to("init_kl_coef"),
        "kl_ctrl.type": _to("adaptive_kl_ctrl", note="adaptive: true"),
        "kl_ctrl.horizon": _to("kl_horizon"),
        "kl_ctrl.target_kl": _to("target_kl"),
        "norm_adv_by_std_in_grpo": _to("reward_normalization.method", note="false: mean"),
        "filter_groups.enable": _to("dynamic_sampling.enable"),
        "filter_groups.max_num_gen_batches": _to("dynamic_sampling.max_num_gen_batches"),
    },
    "trainer": {
        "total_training_steps": _to("max_steps"),
        "total_epochs": _to("max_steps", note=_EPOCHS),
        "save_freq": _to("save_steps", note="-1: above max_steps; the last step always saves"),
        "test_freq": _to("eval_steps", note="-1: 0"),
        "n_gpus_per_node": _to("num_gpus_per_node"),
        "nnodes": _to("num_nodes"),
        "logger": _to("track_with", note="one of stdout, tensorboard, wandb"),
        "project_name": _to("tracker_kwargs", note="wandb: tracker_kwargs.project"),
        "experiment_name": _to("exp_name"),
        "critic_warmup": _to("critic_warmup"),
        "default_local_dir": _to("checkpoint_config.output_dir"),
        "resume_mode": _to("resume_from_checkpoint", note="auto: true"),
        "resume_from_path": _to("resume_from_checkpoint"),
        "max_actor_ckpt_to_keep": _to("max_ckpt_to_keep"),
        "device": _none("the device is detected (cpu, cuda, npu)"),
        "val_before_train": _none("an app option: rlvr_app.eval_before_training (default true)"),
        "log_val_generations": _none("validation generations are not logged"),
    },
    "reward_manager": {
        "name": _none(_REWARD_MANAGER),
        "source": _none(_REWARD_MANAGER),
        "module": _none(_REWARD_MANAGER),
    },
    "critic": {
        **_trainer_role("critic"),
        "model.path": _to("critic.model_args.model_name_or_path"),
        "model.override_config": _to("critic.model_args.model_config_kwargs"),
        "model.enable_gradient_checkpointing": _to(
            "critic.model_args.disable_gradient_checkpointing",
            note="inverted; checkpointing is on by default",
        ),
        "cliprange_value": _to("value_clip"),
        "enable": _none("a critic runs when the critic section is set (adv_estimator gae)"),
    },
    "reward_model": {
        "enable": _none(_RULES),
        "model": _none(_RULES),
        "strategy": _none(_RULES),
        "micro_batch_size_per_gpu": _none(_RULES),
        "reward_manager": _none(_REWARD_MANAGER),
        "launch_reward_fn_async": _none("rewards are scored in a sandbox pool, concurrently"),
        "reward_kwargs.max_resp_len": _to("response_length"),
        "reward_kwargs.overlong_buffer_cfg.enable": _to("overlong_penalty.enable"),
        "reward_kwargs.overlong_buffer_cfg.len": _to("overlong_penalty.buffer_length"),
        "reward_kwargs.overlong_buffer_cfg.penalty_factor": _to("overlong_penalty.penalty_factor"),
        "reward_kwargs.overlong_buffer_cfg.log": _none(
            "overlong-penalty metrics are always logged"
        ),
    },
    "rollout": {
        "nnodes": _to("actor_infer.device_mapping", note="the rollout's device ids"),
        "n_gpus_per_node": _to("actor_infer.device_mapping", note="the rollout's device ids"),
        "total_epochs": _to("max_steps", note=_EPOCHS),
        "test_freq": _to("eval_steps"),
    },
    "async_training": {
        "partial_rollout": _to("async.partial_rollout"),
        "staleness_threshold": _to(
            "async.max_staleness", note="in weight versions; or async_generation_ratio"
        ),
        "use_rollout_log_probs": _none("rollout log-probs are always recorded"),
    },
}
"""verl section -> {verl key under it (a key listed covers the keys below it): its counterpart}.
``critic`` and ``reward_model`` are ROLL sections too (``ROLL_SECTIONS``): only the verl keys
listed under them (and keys under their verl-only blocks, such as ``critic.optim``) are judged
here, the rest as ROLL keys."""

ROLL_SECTIONS = ("critic", "reward_model")
"""Sections of ``VERL_SECTIONS`` that ROLL has too (the schema's critic, ROLL's reward_model)."""

VERL_FILE_MARKERS = ("actor_rollout_ref", "data", "trainer", "algorithm")
"""verl's own top-level sections: a file with two of them is a verl config (Hydra's, with a
``defaults`` list, or a composed dump of one)."""


def counterpart(key: str) -> Counterpart | None:
    """The counterpart of dotted verl ``key`` (listed itself or under a listed prefix), or None."""
    section, _, rest = key.partition(".")
    pairs = VERL_SECTIONS.get(section, {})
    parts = rest.split(".") if rest else []
    for end in range(len(parts), 0, -1):
        found = pairs.get(".".join(parts[:end]))
        if found is not None:
            return found
    return None


def describe(found: Counterpart) -> str:
    """``verl key; use KEY (note)`` or ``verl key; no counterpart: note``."""
    if not found.keys:
        return f"verl key; no counterpart: {found.note}"
    note = f" ({found.note})" if found.note else ""
    return f"verl key; use {' and '.join(found.keys)}{note}"


def verl_section_hint(key: str) -> str:
    """The hint for an unknown top-level ``key`` that is a verl-only section ('' otherwise)."""
    if key not in VERL_SECTIONS or key in ROLL_SECTIONS:
        return ""
    head = f"'{key}' is a verl section; this stack reads ROLL's key names"
    return f"{head}: {_pairs(key)}" if _pairs(key) else head


def verl_key_hint(key: str) -> str:
    """The hint for dotted ``key`` when it is a verl key or section ('' otherwise)."""
    found = counterpart(key)
    return describe(found) if found is not None else verl_section_hint(key)


def _pairs(section: str, *, qualified: bool = True) -> str:
    """``section.key -> ROLL key, ...`` (``key -> ...`` unqualified) of the section's keys that
    have a counterpart."""
    head = f"{section}." if qualified else ""
    return ", ".join(
        f"{head}{verl} -> {' and '.join(found.keys)}"
        for verl, found in VERL_SECTIONS[section].items()
        if found.keys
    )


_UNLISTED = "verl key; no counterpart listed (this stack reads ROLL's key names)"


def _leaves(node: Any, path: str) -> Iterator[str]:
    """Dotted paths of ``node``'s entries, stopping at listed verl keys and non-mappings."""
    if not isinstance(node, Mapping) or not node or counterpart(path) is not None:
        yield path
        return
    for key, value in node.items():
        yield from _leaves(value, f"{path}.{key}")


def _under_verl_block(path: str) -> bool:
    """Whether ``path`` (section.block....) lies under a block that only verl has, such as
    ``critic.optim`` (the listed keys' first segments)."""
    section, _, rest = path.partition(".")
    block = rest.split(".")[0]
    return "." in rest and any(k.split(".")[0] == block for k in VERL_SECTIONS[section])


def verl_key_issues(data: Mapping[str, Any]) -> list[ConfigIssue]:
    """One error per verl key of a config mapping: each key under a verl-only section (those
    without a counterpart listed say so), and the listed verl keys under ``ROLL_SECTIONS``."""
    issues: list[ConfigIssue] = []
    for section, value in data.items():
        if section not in VERL_SECTIONS:
            continue
        shared = section in ROLL_SECTIONS
        if not isinstance(value, Mapping) or not value:
            if not shared:
                issues.append(ConfigIssue(section, f"unknown key; {verl_section_hint(section)}"))
            continue
        for path in _leaves(value, section):
            found = counterpart(path)
            if found is not None:
                issues.append(ConfigIssue(path, describe(found)))
            elif not shared or _under_verl_block(path):
                issues.append(ConfigIssue(path, _UNLISTED))
    return issues


def is_verl_file(top_level: Collection[str]) -> bool:
    """Whether a file's top-level keys are those of a verl config (two of
    ``VERL_FILE_MARKERS``)."""
    return sum(k in top_level for k in VERL_FILE_MARKERS) >= 2


def verl_file_issue(source: str, top_level: Collection[str]) -> ConfigIssue:
    """The one error of a verl config file given as a config: it names the file and, per verl
    section of the file, the ROLL keys that hold its settings."""
    markers = ", ".join(s for s in VERL_FILE_MARKERS if s in top_level)
    hydra = "Hydra defaults list and " if "defaults" in top_level else ""
    lines = "\n".join(
        f"{s}: {_pairs(s, qualified=False)}" for s in VERL_SECTIONS if s in top_level and _pairs(s)
    )
    return ConfigIssue(
        "",
        f"{source} is a verl config ({hydra}sections {markers}); this stack reads ROLL's key "
        f"names. Run it as verl would with `--verl-config {source}` (apps/rlvr, apps/async), or "
        f"translate it with `rl-config convert --from verl --config-path DIR --config-name NAME "
        "-o OUT.yaml`; by hand, a ROLL config (e.g. apps/rlvr/configs/cpu_default.yaml) holds "
        f"these keys:\n{lines}",
    )
