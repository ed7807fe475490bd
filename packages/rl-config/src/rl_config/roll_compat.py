"""ROLL keys this stack accepts without implementing them, and the Megatron-only keys.

Plain tables, importable on their own (no logic): ``rl_config.roll_keys`` applies them. A key is a
dotted path; a segment may be a shell pattern (``*`` = any one segment, ``*_env_manager``,
``video_*``). ``ROLE`` stands for a worker section (actor_train, actor_infer, reference, critic).

* ``ROLL_IGNORED``: keys that are not fields of ROLL's config dataclasses. ROLL builds its config
  with ``dacite.from_dict`` (not strict), which drops them; we drop them too, with a warning
  "ignored, as ROLL ignores it".
* ``ROLL_NOT_SUPPORTED``: ROLL fields this stack does not implement. Accepted so a ROLL file
  validates; a set value (not null/false/empty) is reported as a warning naming what is missing.
* ``MEGATRON_ONLY``: strategy names and ``strategy_config`` keys that only Megatron-LM reads. A config
  that uses a Megatron strategy is refused with one message naming them and the
  ``rl-config convert`` command.
"""

from __future__ import annotations

ROLES = ("actor_train", "actor_infer", "reference", "critic")
"""What ``ROLE`` in a pattern stands for."""

ROLL_IGNORED: dict[str, str] = {
    "ROLE.model_args.flash_attn": "not a ROLL ModelArguments field; the kernel is chosen by "
    "model_args.attn_implementation",
    "ROLE.data_args.dataset_dir": "not a ROLL DataArguments field; give paths in data_args.file_name",
    "validation.data_args.dataset_dir": "not a ROLL DataArguments field; give paths in "
    "validation.data_args.file_name",
    "validation.data_args.interleave_probs": "not a ROLL DataArguments field",
    "ROLE.data_args.interleave_probs": "not a ROLL DataArguments field; use "
    "data_args.domain_interleave_probs",
    "ROLE.use_remove_padding": "not a ROLL WorkerConfig field",
    "*_env_manager.n_groups": "legacy key, not a ROLL EnvManagerConfig field; use num_groups_partition",
    "*_env_manager.env_groups": "legacy key, not a ROLL EnvManagerConfig field; use num_env_groups",
    "custom_envs.*.max_steps_per_traj": "legacy key ROLL no longer reads; use max_steps",
    "custom_envs.*.max_actions_per_traj": "legacy key ROLL no longer reads; use max_steps",
    "model_name": "not a ROLL config field (a label some examples interpolate)",
    "enable_response_mask": "not a ROLL config field",
    "action_sep": "not a ROLL config field",
    "use_turn_scores": "not a ROLL config field",
    "enable_think": "not a ROLL config field",
    "default_history_length": "not a ROLL config field (history_length is set per env)",
    "positive_loss_coef": "not a ROLL config field",
    "train_batch_size": "not a ROLL config field; samples per step come from rollout_batch_size",
}

_VL = "multimodal (image/video/audio) inputs are not implemented"
_ENV = "ROLL env-manager option; this stack's env manager does not implement it"

ROLL_NOT_SUPPORTED: dict[str, str] = {
    # RLVR pipeline sections and knobs
    "reward_model": "ROLL's reward-model worker section; a reward model here is a rewards "
    "domain (rewards.<domain>.reward_fn: reward_model, its model_args and device_mapping)",
    "reward": "ROLL's reward worker; rewards are the rewards section, scored in the rl-envs "
    "sandbox",
    "reward_system_config": "ROLL's remote reward system; rewards are scored in the local "
    "rl-envs sandbox",
    "error_max_len_clip": "ROLL's clipping of failed long responses is not implemented",
    "use_topr_neg_loss_coef": "ROLL's TOPR negative-sample coefficient; use "
    "actor_train.topr_negative_weight",
    "importance_sampling": "ROLL's token/seq importance-sampling switch; use "
    "train_infer_correction.is_weight",
    "batch_adjust_mode": "ROLL's batch resizing (copy/delete/random_sample) of agentic batches",
    "rollout_mock": "ROLL's rollout mocking for debugging",
    "rollout_dump_dir": "ROLL's rollout dumps for debugging",
    "profiler_memory": "ROLL's memory profiler",
    "profiler_output_dir": "ROLL's profiler output",
    "model_download_type": "ROLL's model download source (this stack loads local paths or hub ids)",
    "enable_old_logprobs_recompute": "ROLL's old-log-prob caching switch",
    "is_offload_optimizer_states_in_train_step": "ROLL's optimizer offload inside a train step",
    "skip_mock_system_prompt": "ROLL's agentic prompt option",
    "parse_tool_call_parameter_to_dict": "ROLL's Qwen3-Coder tool-call parsing option",
    # worker options
    "ROLE.model_args.ulysses_size": "Ulysses sequence parallelism is not implemented; each rank "
    "holds whole sequences",
    "ROLE.model_args.device_map": "HF device_map placement is not used; devices come from "
    "ROLE.device_mapping",
    "ROLE.offload_nccl": "ROLL's NCCL buffer offload",
    "ROLE.sequence_packing_args": "sequence packing is not implemented",
    "ROLE.data_args.custom_data_kwargs_func": "ROLL's dataset hook",
    "ROLE.data_args.image_*": _VL,
    "validation.data_args.image_*": _VL,
    "validation.data_args.video_*": _VL,
    "validation.data_args.audio_*": _VL,
    "validation.data_args.custom_data_kwargs_func": "ROLL's dataset hook",
    "ROLE.data_args.video_*": _VL,
    "ROLE.data_args.audio_*": _VL,
    # ROLL's FSDP2 options that rl-train's FSDP2 backend does not have
    "ROLE.strategy_args.strategy_config.fsdp_size": "hybrid sharding groups; FSDP2 shards over "
    "all ranks of the role",
    "ROLE.strategy_args.strategy_config.efsdp_size": "expert sharding groups",
    "ROLE.strategy_args.strategy_config.ep_size": "expert parallelism",
    "ROLE.strategy_args.strategy_config.wrap_policy": "FSDP2 wraps each decoder layer",
    "ROLE.strategy_args.strategy_config.apply_expert_patch": "ROLL's MoE patch",
    "ROLE.strategy_args.strategy_config.apply_tiled_mlp": "ROLL's tiled MLP",
    "ROLE.strategy_args.strategy_config.tiled_num_shards": "ROLL's tiled MLP",
    "ROLE.strategy_args.strategy_config.moe_use_grouped_mm": "ROLL's MoE kernel",
    "ROLE.strategy_args.strategy_config.use_batched_model_update": "ROLL's weight-sync batching",
    # ROLL's vllm options that vLLM 0.32's EngineArgs (rl_rollout.vllm_options) does not have, or
    # that the vllm engine sets itself
    "ROLE.strategy_args.strategy_config.sleep_level": "ROLL's vLLM sleep level; the vllm engine "
    "uses vLLM's sleep mode where the platform has it",
    "ROLE.strategy_args.strategy_config.disable_mm_preprocessor_cache": "an option of older vLLM "
    "releases (multimodal inputs are not supported)",
    "ROLE.strategy_args.strategy_config.cuda_graph_sizes": "an option of older vLLM releases; "
    "use cudagraph_capture_sizes",
    "ROLE.strategy_args.strategy_config.VLLM_USE_V1": "vLLM 0.32 has only its V1 engine",
    "ROLE.strategy_args.strategy_config.disable_log_stats": "the vllm engine turns vLLM's stats "
    "logging off itself",
    # env managers and env definitions
    "*_env_manager.generating_args": "per-manager sampling; sampling comes from "
    "actor_infer.generating_args",
    "*_env_manager.system_envs": "per-manager environment variables; use system_envs",
    "custom_envs.*.agent_runner_cls": _ENV,
    "custom_envs.*.history_length": _ENV,
    "custom_envs.*.tool_wrapper": _ENV,
    "custom_envs.*.pre_step_template": _ENV,
    "custom_envs.*.next_step_template": _ENV,
    "custom_envs.*.max_tokens": _ENV + "; use max_tokens_per_step",
    "custom_envs.*.env_instruction": _ENV,
    # reward normalisation scopes of ROLL's agentic config
    "reward_normalization.norm_mean_type": "ROLL's agentic normalisation scope; use "
    "reward_normalization.grouping and method",
    "reward_normalization.norm_std_type": "ROLL's agentic normalisation scope; use "
    "reward_normalization.grouping and method",
}

MEGATRON_STRATEGIES: dict[str, str] = {
    "megatron_train": "Megatron-LM training backend",
    "megatron_infer": "Megatron-LM forward-only backend",
}
"""Strategy names that make a config Megatron-only."""

MEGATRON_ONLY: dict[str, str] = {
    "ROLE.strategy_args.strategy_config.tensor_model_parallel_size": "tensor parallelism",
    "ROLE.strategy_args.strategy_config.pipeline_model_parallel_size": "pipeline parallelism",
    "ROLE.strategy_args.strategy_config.virtual_pipeline_model_parallel_size": "interleaved "
    "pipeline stages",
    "ROLE.strategy_args.strategy_config.pipeline_model_parallel_layout": "pipeline layout",
    "ROLE.strategy_args.strategy_config.context_parallel_size": "context parallelism",
    "ROLE.strategy_args.strategy_config.expert_model_parallel_size": "expert parallelism",
    "ROLE.strategy_args.strategy_config.sequence_parallel": "Megatron sequence parallelism",
    "ROLE.strategy_args.strategy_config.use_distributed_optimizer": "Megatron distributed "
    "optimizer (FSDP2/ZeRO shard optimizer states anyway)",
    "ROLE.strategy_args.strategy_config.distrib_optim_fully_reshardable": "Megatron optimizer",
    "ROLE.strategy_args.strategy_config.overlap_grad_reduce": "Megatron communication overlap",
    "ROLE.strategy_args.strategy_config.recompute_granularity": "Megatron activation recompute "
    "(use model_args.disable_gradient_checkpointing)",
    "ROLE.strategy_args.strategy_config.recompute_modules": "Megatron activation recompute",
    "ROLE.strategy_args.strategy_config.moe_*": "Megatron MoE kernels and dispatch",
    "ROLE.strategy_args.strategy_config.bf16": "Megatron precision flag (use model_args.dtype)",
    "ROLE.strategy_args.strategy_config.bias_activation_fusion": "Megatron fused kernel",
    "ROLE.strategy_args.strategy_config.apply_rope_fusion": "Megatron fused kernel",
    "ROLE.strategy_args.strategy_config.cross_entropy_loss_fusion": "Megatron fused kernel",
    "ROLE.strategy_args.strategy_config.account_for_*": "Megatron pipeline split",
    "ROLE.strategy_args.strategy_config.additional_configs": "extra Megatron arguments",
    "ROLE.strategy_args.strategy_config.max_grad_norm": "Megatron gradient clipping (use "
    "max_grad_norm at the top level)",
}
"""Keys under a Megatron strategy's ``strategy_config`` (any other key there is Megatron's too)."""

MEGATRON_PARALLEL_SIZES = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
)
"""Model-parallel sizes that ``rl-config convert`` folds into data parallelism."""

STRATEGY_ALIASES: dict[str, dict[str, str]] = {
    "reference.strategy_args.strategy_name": {
        "fsdp2_infer": "fsdp2_train",
        "deepspeed_infer": "deepspeed_train",
    },
}
"""ROLL strategy names that this stack runs under another name (same computation)."""

KEY_ALIASES: dict[str, str] = {
    "ROLE.strategy_args.strategy_config.offload_policy": "cpu_offload",
}
"""ROLL keys renamed to this stack's name (same meaning): FSDP2 parameter offload to CPU."""

VALUE_ALIASES: dict[str, dict[str, str]] = {
    "ROLE.strategy_args.strategy_config.param_dtype": {
        "float32": "fp32",
        "bfloat16": "bf16",
        "float16": "fp16",
    },
    "ROLE.strategy_args.strategy_config.reduce_dtype": {
        "float32": "fp32",
        "bfloat16": "bf16",
        "float16": "fp16",
    },
}
"""ROLL's spellings of values (torch dtype names) -> this stack's."""

NONE_STRINGS = ("reward_norm", "norm_mean_type", "norm_std_type")
"""Top-level keys where ROLL's YAML writes ``None`` (a string) for null."""

ROLL_TEMPLATE_PLACEHOLDERS: dict[str, str] = {
    "history": "filled by ROLL's step/GiGPO env managers (turn history)",
    "history_length": "filled by ROLL's step/GiGPO env managers",
    "current_observation": "filled by ROLL's step/GiGPO env managers",
    "current_step": "filled by ROLL's step/GiGPO env managers",
    "step_count": "filled by ROLL's step/GiGPO env managers",
    "env_instruction": "filled by ROLL's step/GiGPO env managers",
    "suffix": "filled by ROLL's sandbox env manager",
}
"""``custom_envs.*.agent_template`` placeholders of ROLL's env managers that this stack does not
fill: a warning, not an error (other unknown placeholders are errors)."""

ROLL_PIPELINES_NOT_IMPLEMENTED: dict[str, tuple[str, ...]] = {
    "distillation": (
        "student",
        "teacher",
        "student_train",
        "student_infer",
        "student_pretrain",
        "teacher_pretrain",
        "kd_objective",
        "distill_loss_weight",
    ),
}
"""ROLL pipelines this stack does not have -> the top-level keys that mark a config of one (the
config is refused with one message naming them, before its keys are judged one by one)."""

ROLL_UNSUPPORTED_VALUES: dict[str, dict[str, str]] = {
    "adv_estimator": {
        "agentic_reinforce": "ROLL's agentic REINFORCE is not implemented; use reinforce",
    },
}
"""Values ROLL accepts that this stack refuses (an error naming the key and the alternative)."""

DPO_KEYS = (
    "loss_type",
    "ipo",
    "beta",
    "label_smoothing",
    "simpo_gamma",
    "kto_desirable_weight",
    "kto_undesirable_weight",
    "chosen_key",
    "rejected_key",
    "label_key",
    "completion_key",
    "precompute_ref_log_probs",
    "truncation_mode",
)
"""Top-level keys that mark a DPO config (ROLL's five and ours) (its batch is per_device × accumulation × ranks;
rollout_batch_size is not used)."""

SFT_ROLE = "sft_train"
"""ROLL's SFT training section: read as actor_train (rl_config.roll_keys.rename_sft_role)."""

SFT_KEYS = ("prompt_key", "query_key", "response_key", "system_key")
"""Top-level keys that mark an SFT config (ROLL's SFT pipeline), beside an `sft_train` section."""
