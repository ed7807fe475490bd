"""What each verl key does under ``--verl``: translated (to this stack's key, or by the batch and
device arithmetic of :mod:`rl_config.verl_translate`), accepted without effect (a memory or speed
knob, or a behaviour this stack always has), or refused with the reason.

A key is looked up in ``RULES`` (exact dotted key), then in ``PATTERNS`` (``fnmatch`` patterns in
order), then in ``rl_config.verl_keys.VERL_SECTIONS`` (a single counterpart key: translated as is;
none: refused unless the value asks for nothing). ``rule_for`` returns None only for a key that
none of them knows; a test walks verl's own key set (its ``ppo_trainer.yaml``, composed) and fails
on such a key.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from rl_config.verl_keys import counterpart

Kind = Literal["to", "derived", "noop", "only", "refuse"]


@dataclass(frozen=True)
class Rule:
    """``to``: ``target`` = ``convert(value)``; ``derived``: read by the arithmetic of
    ``verl_translate.build`` (which writes its rows); ``noop``: accepted, no effect (``why``);
    ``only``: accepted without effect when ``accept(value)``, else refused (``why``);
    ``refuse``: always refused (``why``)."""

    kind: Kind
    why: str = ""
    target: str = ""
    convert: Callable[[Any], Any] | None = None
    accept: Callable[[Any], bool] | None = None


def unset(value: Any) -> bool:
    """A value that asks for nothing: null, false, 0, empty, or an interpolation of verl's."""
    if isinstance(value, str):
        return value in ("", "null", "None") or value.startswith("${")
    return value is None or value is False or value == 0 or value in ({}, [])


def to(target: str, convert: Callable[[Any], Any] | None = None, why: str = "") -> Rule:
    return Rule("to", why, target, convert)


def derived(why: str) -> Rule:
    return Rule("derived", why)


def noop(why: str) -> Rule:
    return Rule("noop", why)


def only(why: str, accept: Callable[[Any], bool] = unset) -> Rule:
    return Rule("only", why, accept=accept)


def equals(*values: Any) -> Callable[[Any], bool]:
    return lambda v: unset(v) or v in values or str(v).lower() in {str(x).lower() for x in values}


def refuse(why: str) -> Rule:
    return Rule("refuse", why)


MEGATRON = "Megatron-LM is not implemented; FSDP2 (actor.strategy=fsdp or fsdp2) is"
SGLANG = "SGLang is not implemented; rollout.name=vllm or hf"
VISION = "vision-language models are not implemented (text models only)"
ULYSSES = (
    "a memory knob here: Ulysses sequence parallelism is not implemented, each device holds whole "
    "sequences and is a data-parallel rank (the same samples per optimizer step)"
)
LORA = "LoRA on the critic is not translated (the critic trains all its weights)"
RM = "reward_model.enable: a reward model scores every response (rewards.reward_model)"
GENRM = (
    "with reward_model.enable and verl's reward loop, this function scores with the served reward "
    "model (a generative reward model): not translated; a judge is a rewards domain with "
    "reward_fn: llm_judge in this stack's config"
)
OVERRIDE = "HF model config attributes: model_args.model_config_kwargs"
PROFILER = "verl's profilers (nsys, npu, torch) are not run here; the run trains the same"
MULTI_TURN = "verl's multi-turn tool rollout is not translated (apps/agentic runs multi-turn envs)"
MEMORY = "a memory knob: this stack sizes its own micro-batches"
SPEED = "a speed knob with no effect on what is trained"
ALWAYS = "this stack always does so"
LOGPROB_BATCH = "log-prob forward passes: a memory knob"
RAY = "Ray is started by the app (rlvr_app.num_cpus)"
ARITH = "verl's batch arithmetic (see the derived rows)"
DEVICES = "the device layout (see the derived rows)"
STEPS = "the step count (see the derived rows)"

_STRATEGY_OK = equals("fsdp", "fsdp2")

_ROLE_FSDP: dict[str, Rule] = {
    "fsdp_config.param_offload": derived("CPU offload of the role (FSDP2 cpu_offload)"),
    "fsdp_config.optimizer_offload": derived("CPU offload of the role (FSDP2 cpu_offload)"),
    "fsdp_config.offload_policy": derived("CPU offload of the role (FSDP2 cpu_offload)"),
    "fsdp_config.reshard_after_forward": noop("FSDP2 reshards after forward (default)"),
    "fsdp_config.fsdp_size": derived("FSDP2 shards over all ranks of the role"),
    "fsdp_config.forward_prefetch": noop(SPEED),
    "fsdp_config.model_dtype": only("master weights are fp32 here", equals("fp32")),
    "fsdp_config.use_orig_params": noop("FSDP1 option; FSDP2 keeps the original parameters"),
    "fsdp_config.seed": noop("the run's seed (trainer's) seeds every worker"),
    "fsdp_config.full_determinism": only("full determinism is not a switch here"),
    "fsdp_config.ulysses_sequence_parallel_size": noop(ULYSSES),
    "fsdp_config.entropy_from_logits_with_chunking": noop(MEMORY),
    "fsdp_config.use_torch_compile": noop(SPEED),
    "fsdp_config.entropy_checkpointing": noop(MEMORY),
    "fsdp_config.forward_only": noop("set by verl per role"),
    "fsdp_config.strategy": only("FSDP (fsdp, fsdp2) only", _STRATEGY_OK),
    "fsdp_config.dtype": noop(
        "mixed precision: derived from trainer.device (bf16 on accelerators)"
    ),
    "fsdp_config.wrap_policy.min_num_params": noop("FSDP2 shards per decoder layer"),
    "fsdp_config.mixed_precision": noop("mixed precision: derived from trainer.device"),
    "fsdp_config.dtensor_parallel_size": noop(ULYSSES),
}


def _role(prefix: str) -> dict[str, Rule]:
    """Rules of a trained role's keys (``actor_rollout_ref.actor``, ``critic``)."""
    rules = {f"{prefix}.{k}": v for k, v in _ROLE_FSDP.items()}
    rules.update(
        {
            f"{prefix}.strategy": only(MEGATRON, _STRATEGY_OK),
            f"{prefix}.ppo_mini_batch_size": derived(ARITH),
            f"{prefix}.ppo_micro_batch_size": derived(ARITH),
            f"{prefix}.ppo_micro_batch_size_per_gpu": derived(ARITH),
            f"{prefix}.ppo_epochs": derived("ppo_epochs"),
            f"{prefix}.rollout_n": noop("verl copies rollout.n here"),
            f"{prefix}.shuffle": only("mini-batches are taken in order", equals(False)),
            f"{prefix}.data_loader_seed": noop("the run's seed"),
            f"{prefix}.grad_clip": derived("max_grad_norm"),
            f"{prefix}.ulysses_sequence_parallel_size": noop(ULYSSES),
            f"{prefix}.use_dynamic_bsz": derived(MEMORY),
            f"{prefix}.ppo_max_token_len_per_gpu": derived(MEMORY),
            f"{prefix}.forward_max_token_len_per_gpu": noop(MEMORY),
            f"{prefix}.forward_micro_batch_size": noop(MEMORY),
            f"{prefix}.forward_micro_batch_size_per_gpu": noop(MEMORY),
            f"{prefix}.loss_scale_factor": only("loss scaling factors are not implemented"),
            f"{prefix}.optim.lr": derived("learning rate"),
            f"{prefix}.optim.weight_decay": derived("weight decay"),
            f"{prefix}.optim.betas": derived("Adam betas"),
            f"{prefix}.optim.clip_grad": derived("max_grad_norm"),
            f"{prefix}.optim.lr_warmup_steps": derived("warm-up steps"),
            f"{prefix}.optim.lr_warmup_steps_ratio": derived("warm-up ratio"),
            f"{prefix}.optim.lr_scheduler_type": derived("LR schedule"),
            f"{prefix}.optim.warmup_style": derived("LR schedule"),
            f"{prefix}.optim.lr_decay_style": derived("LR schedule"),
            f"{prefix}.optim.lr_decay_steps": noop("the schedule spans the run's optimizer steps"),
            f"{prefix}.optim.total_training_steps": noop("set by verl from the step count"),
            f"{prefix}.optim.min_lr_ratio": only(
                "the cosine schedule decays to 0 here", equals(0.0)
            ),
            f"{prefix}.optim.num_cycles": only("one cosine half-cycle", equals(0.5)),
            f"{prefix}.optim.optimizer": only("AdamW only", equals("AdamW", "adamw")),
            f"{prefix}.optim.optimizer_impl": only("torch.optim's AdamW", equals("torch.optim")),
            f"{prefix}.optim.override_optimizer_config": only(MEGATRON),
            f"{prefix}.optim.weight_decay_incr_style": refuse(MEGATRON),
            f"{prefix}.checkpoint.save_contents": noop(
                "checkpoints hold model, optimizer and run state"
            ),
            f"{prefix}.checkpoint.load_contents": noop(
                "checkpoints hold model, optimizer and run state"
            ),
            f"{prefix}.checkpoint.async_save": only("checkpoints are saved synchronously"),
            f"{prefix}.model.enable_gradient_checkpointing": derived("activation checkpointing"),
            f"{prefix}.model.enable_activation_offload": only("activation offload"),
        }
    )
    return rules


_A = "actor_rollout_ref"
RULES: dict[str, Rule] = {
    **_role(f"{_A}.actor"),
    **_role("critic"),
    # actor loss
    f"{_A}.actor.clip_ratio": derived("PPO clip"),
    f"{_A}.actor.clip_ratio_low": derived("PPO clip (clip-higher when low != high)"),
    f"{_A}.actor.clip_ratio_high": derived("PPO clip (clip-higher when low != high)"),
    f"{_A}.actor.clip_ratio_c": derived("verl's policy loss is always dual-clip"),
    f"{_A}.actor.tau_pos": noop("SAPO's temperatures (policy_loss.loss_mode=sapo only)"),
    f"{_A}.actor.tau_neg": noop("SAPO's temperatures (policy_loss.loss_mode=sapo only)"),
    f"{_A}.actor.freeze_vision_tower": only(VISION),
    f"{_A}.actor.policy_loss.loss_mode": derived("policy loss"),
    f"{_A}.actor.policy_loss.clip_cov_ratio": noop("clip_cov's options keep this stack's defaults"),
    f"{_A}.actor.policy_loss.clip_cov_lb": noop("clip_cov's options keep this stack's defaults"),
    f"{_A}.actor.policy_loss.clip_cov_ub": noop("clip_cov's options keep this stack's defaults"),
    f"{_A}.actor.policy_loss.kl_cov_ratio": noop("kl_cov's options keep this stack's defaults"),
    f"{_A}.actor.policy_loss.ppo_kl_coef": noop("kl_cov's options keep this stack's defaults"),
    f"{_A}.actor.entropy_coeff": derived("entropy bonus"),
    f"{_A}.actor.loss_agg_mode": derived("loss_agg_mode"),
    f"{_A}.actor.calculate_entropy": noop("entropy is logged when its coefficient is set"),
    f"{_A}.actor.use_kl_loss": derived("KL loss"),
    f"{_A}.actor.kl_loss_coef": derived("KL loss"),
    f"{_A}.actor.kl_loss_type": derived("KL loss"),
    f"{_A}.actor.use_prefix_grouper": noop(SPEED),
    f"{_A}.actor.use_torch_compile": noop(SPEED),
    f"{_A}.actor.use_fused_kernels": noop(SPEED),
    f"{_A}.actor.use_remove_padding": noop(SPEED),
    f"{_A}.actor.entropy_from_logits_with_chunking": noop(MEMORY),
    f"{_A}.actor.entropy_checkpointing": noop(MEMORY),
    f"{_A}.actor.calculate_sum_pi_squared": derived("optimal_token_baseline's statistic"),
    f"{_A}.actor.sum_pi_squared_checkpointing": noop(MEMORY),
    f"{_A}.actor.use_rollout_log_probs": derived("old log-probs"),
    # reference
    f"{_A}.ref.rollout_n": noop("verl copies rollout.n here"),
    f"{_A}.ref.strategy": only(MEGATRON, _STRATEGY_OK),
    f"{_A}.ref.use_torch_compile": noop(SPEED),
    f"{_A}.ref.log_prob_micro_batch_size": noop(LOGPROB_BATCH),
    f"{_A}.ref.log_prob_micro_batch_size_per_gpu": noop(LOGPROB_BATCH),
    f"{_A}.ref.log_prob_use_dynamic_bsz": noop(LOGPROB_BATCH),
    f"{_A}.ref.log_prob_max_token_len_per_gpu": noop(LOGPROB_BATCH),
    f"{_A}.ref.ulysses_sequence_parallel_size": noop(ULYSSES),
    f"{_A}.ref.entropy_from_logits_with_chunking": noop(MEMORY),
    f"{_A}.ref.entropy_checkpointing": noop(MEMORY),
    **{f"{_A}.ref.{k}": v for k, v in _ROLE_FSDP.items()},
    f"{_A}.ref.fsdp_config.param_offload": derived("reference offload"),
    f"{_A}.ref.fsdp_config.fsdp_size": noop("the reference shards over its own ranks"),
    f"{_A}.ref.fsdp_config.offload_policy": derived("reference offload"),
    f"{_A}.ref.fsdp_config.optimizer_offload": noop("the reference has no optimizer"),
    # rollout
    f"{_A}.rollout.name": derived("generation engine"),
    f"{_A}.rollout.mode": noop(
        "verl's engine serving mode (sync or async server), not asynchronous training: "
        "this stack's engines serve requests either way"
    ),
    f"{_A}.rollout.n": derived(ARITH),
    f"{_A}.rollout.temperature": derived("sampling"),
    f"{_A}.rollout.top_k": derived("sampling"),
    f"{_A}.rollout.top_p": derived("sampling"),
    f"{_A}.rollout.do_sample": derived("sampling"),
    f"{_A}.rollout.prompt_length": noop("verl copies data.max_prompt_length here"),
    f"{_A}.rollout.response_length": noop("verl copies data.max_response_length here"),
    f"{_A}.rollout.dtype": noop("the engine runs the model's dtype (bf16 on accelerators)"),
    f"{_A}.rollout.gpu_memory_utilization": derived("vLLM memory"),
    f"{_A}.rollout.ignore_eos": only("generation stops at EOS"),
    f"{_A}.rollout.enforce_eager": derived("vLLM option"),
    f"{_A}.rollout.cudagraph_capture_sizes": noop(SPEED),
    f"{_A}.rollout.free_cache_engine": noop(
        "colocated engines sleep while training (vLLM sleep mode where the platform has it)"
    ),
    f"{_A}.rollout.tensor_model_parallel_size": derived("vLLM tensor parallelism"),
    f"{_A}.rollout.data_parallel_size": only(
        "engine data parallelism is one engine per device group", equals(1)
    ),
    f"{_A}.rollout.expert_parallel_size": only("expert parallelism is not implemented", equals(1)),
    f"{_A}.rollout.pipeline_model_parallel_size": only(
        "engine pipeline parallelism is not implemented", equals(1)
    ),
    f"{_A}.rollout.max_num_batched_tokens": derived("vLLM option"),
    f"{_A}.rollout.max_model_len": derived("vLLM option"),
    f"{_A}.rollout.max_num_seqs": derived("vLLM option"),
    f"{_A}.rollout.enable_chunked_prefill": derived("vLLM option"),
    f"{_A}.rollout.enable_prefix_caching": derived("vLLM option"),
    f"{_A}.rollout.logprobs_mode": only(
        "rollout log-probs are of the processed (temperature, top-k/p) distribution",
        equals("processed_logprobs"),
    ),
    f"{_A}.rollout.scheduling_policy": only("first come, first served", equals("fcfs")),
    f"{_A}.rollout.load_format": noop("weights reach the engine by this stack's weight sync"),
    f"{_A}.rollout.layered_summon": noop(MEMORY),
    f"{_A}.rollout.log_prob_micro_batch_size": noop(LOGPROB_BATCH),
    f"{_A}.rollout.log_prob_micro_batch_size_per_gpu": derived(LOGPROB_BATCH),
    f"{_A}.rollout.log_prob_use_dynamic_bsz": noop(LOGPROB_BATCH),
    f"{_A}.rollout.log_prob_max_token_len_per_gpu": noop(LOGPROB_BATCH),
    f"{_A}.rollout.disable_log_stats": noop("engine statistics are not logged"),
    f"{_A}.rollout.over_sample_rate": only("over-sampling is not implemented"),
    f"{_A}.rollout.multi_stage_wake_up": noop(MEMORY),
    f"{_A}.rollout.calculate_log_probs": noop("rollout log-probs are always recorded"),
    f"{_A}.rollout.skip_rollout": only("rollout dumps are not replayed"),
    f"{_A}.rollout.skip_dump_dir": noop("rollout dumps are not replayed"),
    f"{_A}.rollout.skip_tokenizer_init": noop(SPEED),
    f"{_A}.rollout.enable_rollout_routing_replay": only("MoE routing replay is not implemented"),
    f"{_A}.rollout.quantization": only("quantized rollout is not implemented"),
    f"{_A}.rollout.quantization_config_file": only("quantized rollout is not implemented"),
    f"{_A}.rollout.mtp": only("multi-token prediction is not implemented"),
    f"{_A}.rollout.limit_images": only(VISION),
    f"{_A}.rollout.val_kwargs.temperature": derived("validation sampling"),
    f"{_A}.rollout.val_kwargs.top_p": derived("validation sampling"),
    f"{_A}.rollout.val_kwargs.top_k": derived("validation sampling"),
    f"{_A}.rollout.val_kwargs.do_sample": derived("validation sampling"),
    f"{_A}.rollout.val_kwargs.n": derived("validation sampling"),
    f"{_A}.rollout.agent.num_workers": noop("rollout concurrency is the engine's"),
    f"{_A}.rollout.agent.default_agent_loop": only(
        "single-turn generation", equals("single_turn_agent")
    ),
    f"{_A}.rollout.agent.agent_loop_config_path": only(MULTI_TURN),
    f"{_A}.rollout.agent.custom_async_server.path": only("custom rollout servers are not loaded"),
    f"{_A}.rollout.agent.custom_async_server.name": only("custom rollout servers are not loaded"),
    f"{_A}.rollout.checkpoint_engine.backend": noop("weights reach the engines by rl-sync"),
    f"{_A}.rollout.checkpoint_engine.update_weights_bucket_megabytes": noop(
        "weights reach the engines by rl-sync (model_update_buffer_size_mb)"
    ),
    f"{_A}.rollout.checkpoint_engine.engine_kwargs": noop("weights reach the engines by rl-sync"),
    f"{_A}.rollout.trace.backend": only("rollout tracing is not implemented"),
    f"{_A}.rollout.trace.token2text": noop("rollout tracing is not implemented"),
    f"{_A}.rollout.trace.max_samples_per_step_per_worker": noop(
        "rollout tracing is not implemented"
    ),
    f"{_A}.rollout.prometheus.enable": only("Prometheus export is not implemented"),
    f"{_A}.rollout.engine_kwargs.sglang": only(SGLANG),
    f"{_A}.rollout.engine_kwargs.trtllm": only("TensorRT-LLM is not implemented"),
    f"{_A}.rollout.engine_kwargs.vllm": noop("vLLM engine_kwargs are not passed"),
    # model
    f"{_A}.model.path": derived("policy model"),
    f"{_A}.model.hf_config_path": only("the model's own config is used"),
    f"{_A}.model.tokenizer_path": only("the model's own tokenizer is used"),
    f"{_A}.model.use_shm": noop(SPEED),
    f"{_A}.model.trust_remote_code": only("remote model code is never run"),
    f"{_A}.model.custom_chat_template": only("the tokenizer's chat template is used"),
    f"{_A}.model.external_lib": only("external model libraries are not imported"),
    f"{_A}.model.override_config": derived(OVERRIDE),
    f"{_A}.model.enable_gradient_checkpointing": derived("activation checkpointing"),
    f"{_A}.model.enable_activation_offload": only("activation offload is not implemented"),
    f"{_A}.model.use_remove_padding": derived("packed forward"),
    f"{_A}.model.lora_rank": derived("LoRA"),
    f"{_A}.model.lora_alpha": derived("LoRA"),
    f"{_A}.model.target_modules": derived("LoRA"),
    f"{_A}.model.exclude_modules": only("excluding modules from LoRA is not implemented"),
    f"{_A}.model.lora_adapter_path": derived("LoRA"),
    f"{_A}.model.use_liger": noop(SPEED),
    f"{_A}.model.torch_dtype": noop(
        "the model's dtype follows trainer.device (bf16 on accelerators)"
    ),
    f"{_A}.model.use_fused_kernels": noop(SPEED),
    f"{_A}.model.fused_kernel_options.impl_backend": noop(SPEED),
    f"{_A}.hybrid_engine": derived(DEVICES),
    f"{_A}.nccl_timeout": to("rpc_timeout", int, "seconds; collective timeouts follow it"),
    f"{_A}.checkpoint_engine": noop("weights reach the engines by rl-sync"),
    # data
    "data.tokenizer": only("the model's own tokenizer is used"),
    "data.use_shm": noop(SPEED),
    "data.train_files": derived("training data"),
    "data.val_files": derived("held-out data"),
    "data.train_max_samples": only("the whole training file is used", equals(-1)),
    "data.val_max_samples": only("the whole held-out file is used", equals(-1)),
    "data.prompt_key": derived("prompt column"),
    "data.reward_fn_key": only(
        "the reward is chosen by the row's data_source", equals("data_source")
    ),
    "data.max_prompt_length": derived("prompt_length"),
    "data.max_response_length": derived("response_length"),
    "data.train_batch_size": derived(ARITH),
    "data.val_batch_size": noop("validation runs the whole held-out file"),
    "data.tool_config_path": only(MULTI_TURN),
    "data.return_raw_input_ids": noop("prompts are tokenized by the rollout package"),
    "data.return_raw_chat": noop("the chat template is applied by the rollout package"),
    "data.return_full_prompt": noop("prompts are tokenized by the rollout package"),
    "data.shuffle": only("training prompts are shuffled", equals(True)),
    "data.seed": derived("seed"),
    "data.dataloader_num_workers": noop(SPEED),
    "data.image_patch_size": noop(VISION),
    "data.validation_shuffle": noop("validation runs the whole held-out file"),
    "data.filter_overlong_prompts": noop(
        "prompts longer than max_prompt_length are dropped (and counted), "
        "unless data.truncation cuts them"
    ),
    "data.filter_overlong_prompts_workers": noop(SPEED),
    "data.truncation": derived("prompt_truncation (without filter_overlong_prompts)"),
    "data.image_key": noop(VISION),
    "data.video_key": noop(VISION),
    "data.trust_remote_code": only("remote code is never run"),
    "data.custom_cls.path": only("custom dataset classes are not loaded"),
    "data.custom_cls.name": noop("read only with data.custom_cls.path"),
    "data.return_multi_modal_inputs": noop(VISION),
    "data.sampler.class_path": only("custom samplers are not loaded"),
    "data.sampler.class_name": noop("read only with data.sampler.class_path"),
    "data.datagen.path": only("dynamic data generation is not implemented"),
    "data.datagen.name": noop("read only with data.datagen.path"),
    "data.apply_chat_template_kwargs": only("chat template arguments are not passed"),
    # algorithm
    "algorithm.adv_estimator": derived("advantage estimator"),
    "algorithm.gamma": derived("advantage estimator"),
    "algorithm.lam": derived("advantage estimator"),
    "algorithm.norm_adv_by_std_in_grpo": derived("advantage estimator"),
    "algorithm.use_kl_in_reward": derived("KL in reward"),
    "algorithm.kl_penalty": to("kl_penalty"),
    "algorithm.kl_ctrl.type": derived("KL in reward"),
    "algorithm.kl_ctrl.kl_coef": derived("KL in reward"),
    "algorithm.kl_ctrl.horizon": to("kl_horizon"),
    "algorithm.kl_ctrl.target_kl": derived("KL in reward"),
    "algorithm.use_pf_ppo": only("PF-PPO reweighting is not implemented"),
    "algorithm.pf_ppo.reweight_method": noop("read only with use_pf_ppo"),
    "algorithm.pf_ppo.weight_pow": noop("read only with use_pf_ppo"),
    "algorithm.filter_groups.enable": derived("dynamic sampling"),
    "algorithm.filter_groups.metric": only(
        "dynamic sampling filters on the score", equals("acc", "score", "seq_reward")
    ),
    "algorithm.filter_groups.max_num_gen_batches": derived("dynamic sampling"),
    "algorithm.rollout_correction.rollout_is": derived("importance correction"),
    "algorithm.rollout_correction.rollout_is_threshold": derived("importance correction"),
    "algorithm.rollout_correction.rollout_rs": only(
        "rejection sampling by rollout ratio: use train_infer_correction.filters"
    ),
    "algorithm.rollout_correction.rollout_rs_threshold": noop("read only with rollout_rs"),
    "algorithm.rollout_correction.bypass_mode": derived("old log-probs"),
    "algorithm.rollout_correction.loss_type": only("PPO's clipped loss", equals("ppo_clip")),
    "algorithm.rollout_correction.rollout_is_batch_normalize": only(
        "IS weights are not batch-normalised"
    ),
    # reward
    "custom_reward_function.path": derived("reward"),
    "custom_reward_function.name": derived("reward"),
    "reward_manager.source": only("registered reward managers", equals("register")),
    "reward_manager.name": derived("reward"),
    "reward_manager.module.path": only("custom reward managers are not loaded"),
    "reward_manager.module.name": noop("read only with reward_manager.module.path"),
    "reward_model.enable": derived(RM),
    "reward_model.model.path": derived(RM),
    "reward_model.micro_batch_size_per_gpu": derived(RM),
    "reward_model.micro_batch_size": derived(RM),
    "reward_model.enable_resource_pool": derived(RM),
    "reward_model.strategy": only(MEGATRON, _STRATEGY_OK),
    "reward_model.max_length": only("reward model inputs are not truncated"),
    "reward_model.nnodes": noop("read only with reward_model.enable_resource_pool"),
    "reward_model.n_gpus_per_node": noop("read only with reward_model.enable_resource_pool"),
    "reward_model.model.input_tokenizer": noop(
        "the reward model reads the decoded (prompt, response) chat with its own tokenizer and "
        "chat template (verl's path for a tokenizer unlike the policy's)"
    ),
    "reward_model.model.trust_remote_code": only("remote model code is not run"),
    "reward_model.model.external_lib": only("external model libraries are not imported"),
    "reward_model.rollout.name": derived(RM),
    "reward_model.reward_manager": derived("reward"),
    "reward_model.launch_reward_fn_async": noop("rewards are scored in a sandbox pool"),
    "reward_model.use_reward_loop": noop("rule rewards are scored by the reward router"),
    "reward_model.reward_loop_source": noop("rule rewards are scored by the reward router"),
    "reward_model.reward_loop_module_path": only("custom reward loops are not loaded"),
    "reward_model.reward_loop_class_name": noop("read only with reward_loop_module_path"),
    "reward_model.sandbox_fusion.url": derived("code rows' tests: the local rl-envs sandbox"),
    "reward_model.sandbox_fusion.max_concurrent": derived("read with sandbox_fusion.url"),
    "reward_model.sandbox_fusion.memory_limit_mb": derived("read with sandbox_fusion.url"),
    "reward_model.reward_kwargs.max_resp_len": noop("the response length is max_response_length"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.enable": to("overlong_penalty.enable"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.len": to("overlong_penalty.buffer_length"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor": to(
        "overlong_penalty.penalty_factor"
    ),
    "reward_model.reward_kwargs.overlong_buffer_cfg.log": noop("always logged"),
    # trainer
    "trainer.balance_batch": noop("sequence-length balancing across ranks: a speed knob"),
    "trainer.total_epochs": derived(STEPS),
    "trainer.total_training_steps": derived(STEPS),
    "trainer.project_name": derived("names"),
    "trainer.experiment_name": derived("names"),
    "trainer.logger": derived("tracker"),
    "trainer.log_val_generations": noop("validation generations are not logged"),
    "trainer.rollout_data_dir": only("rollout dumps are not written"),
    "trainer.validation_data_dir": only("validation dumps are not written"),
    "trainer.nnodes": derived(DEVICES),
    "trainer.n_gpus_per_node": derived(DEVICES),
    "trainer.save_freq": derived("checkpoint cadence"),
    "trainer.esi_redundant_time": noop("elastic-server instance timing"),
    "trainer.resume_mode": derived("resume"),
    "trainer.resume_from_path": derived("resume"),
    "trainer.val_before_train": derived("validation"),
    "trainer.val_only": only("validation-only runs are not implemented"),
    "trainer.test_freq": derived("validation cadence"),
    "trainer.critic_warmup": to("critic_warmup"),
    "trainer.default_hdfs_dir": only("HDFS is not implemented"),
    "trainer.del_local_ckpt_after_load": only("checkpoints are kept"),
    "trainer.default_local_dir": derived("checkpoint directory"),
    "trainer.max_actor_ckpt_to_keep": derived("checkpoints kept"),
    "trainer.max_critic_ckpt_to_keep": noop("kept like the actor's (max_ckpt_to_keep)"),
    "trainer.ray_wait_register_center_timeout": noop(RAY),
    "trainer.device": derived("device"),
    "trainer.use_legacy_worker_impl": noop("verl's worker implementation choice"),
    "transfer_queue.enable": only("verl's transfer queue is not implemented"),
    "ray_kwargs.ray_init.num_cpus": derived(RAY),
    "ray_kwargs.timeline_json_file": only("Ray timelines are not written"),
    "ray_init.num_cpus": derived(RAY),
    "ray_init.timeline_json_file": only("Ray timelines are not written"),
    # the asynchronous recipes
    "rollout.nnodes": derived(DEVICES),
    "rollout.n_gpus_per_node": derived(DEVICES),
    "rollout.total_rollout_steps": derived(STEPS),
    "rollout.n": noop("the fully-async config's own copy; actor_rollout_ref.rollout.n is read"),
    "data.gen_batch_size": noop("generation batches are the step's prompts"),
    "rollout.total_epochs": derived(STEPS),
    "rollout.test_freq": derived("validation cadence"),
    "async_training.staleness_threshold": derived("asynchronous training"),
    "async_training.trigger_parameter_sync_step": derived(ARITH),
    "async_training.require_batches": derived(ARITH),
    "async_training.partial_rollout": derived("asynchronous training"),
    "async_training.use_rollout_log_probs": derived("old log-probs"),
    "async_training.compute_prox_log_prob": only("proximal log-probs are not computed"),
    "async_training.use_trainer_do_validate": noop("validation runs on the rollout engines"),
    "async_training.checkpoint_engine.enable": noop("weights reach the engines by rl-sync"),
    "async_training.checkpoint_engine.device_buffer_size_M": noop(
        "weights reach the engines by rl-sync (model_update_buffer_size_mb)"
    ),
    "async_training.checkpoint_engine.overlap_broadcast_and_consume": noop(SPEED),
}

PATTERNS: list[tuple[str, Rule]] = [
    (f"{_A}.model.override_config.*", derived(OVERRIDE)),
    ("critic.model.override_config", derived(OVERRIDE)),
    ("critic.model.override_config.*", derived(OVERRIDE)),
    ("*._target_", noop("verl's config class")),
    ("*.megatron", refuse(MEGATRON)),
    ("*.megatron.*", refuse(MEGATRON)),
    ("*.profiler", noop(PROFILER)),
    ("*.profiler.*", noop(PROFILER)),
    ("global_profiler.*", noop(PROFILER)),
    ("*.router_replay.mode", only("MoE router replay is not implemented", equals("disabled"))),
    ("*.router_replay.*", noop("read only with router_replay.mode")),
    ("*.mtp.enable", only("multi-token prediction is not implemented")),
    ("*.mtp.*", noop("read only with mtp.enable")),
    ("*.tiled_mlp.enabled", only("tiled MLP is not implemented")),
    ("*.tiled_mlp.*", noop("read only with tiled_mlp.enabled")),
    ("*.prometheus.*", noop("read only with prometheus.enable")),
    ("*.multi_turn.enable", only(MULTI_TURN)),
    ("*.multi_turn.*", noop("read only with multi_turn.enable")),
    ("*.sglang_*", refuse(SGLANG)),
    ("*.engine_kwargs.sglang.*", refuse(SGLANG)),
    ("*.engine_kwargs.vllm.disable_mm_preprocessor_cache", refuse(VISION)),
    ("*.engine_kwargs.vllm.limit_mm_per_prompt", refuse(VISION)),
    (
        "*.engine_kwargs.vllm.*",
        noop("vLLM engine_kwargs (speed and memory options) are not passed"),
    ),
    ("*.engine_kwargs.trtllm.*", refuse("TensorRT-LLM is not implemented")),
    ("data.apply_chat_template_kwargs.*", refuse("chat template arguments are not passed")),
    ("*.segment.*", refuse("segmented rollout is not implemented")),
    ("critic.model.path", derived("critic model")),
    ("critic.model.fsdp_config.param_offload", derived("CPU offload of the critic")),
    ("critic.model.fsdp_config.optimizer_offload", derived("CPU offload of the critic")),
    ("critic.model.fsdp_config.offload_policy", derived("CPU offload of the critic")),
    ("critic.model.fsdp_config.fsdp_size", derived("FSDP2 shards over all ranks of the role")),
    ("critic.model.use_remove_padding", noop("the critic's forward packs like the actor's")),
    ("critic.model.tokenizer_path", noop("the critic uses the policy's tokenizer")),
    ("critic.model.fsdp_config.*", noop("the critic's FSDP options follow the actor's")),
    ("critic.model.lora_rank", only(LORA)),
    ("critic.model.*", noop("the critic model's loading options follow the actor's")),
    ("critic.enable", derived("critic")),
    ("critic.cliprange_value", to("value_clip")),
    ("critic.rollout_n", noop("verl copies rollout.n here")),
    ("critic.loss_agg_mode", noop("the critic aggregates like the actor (loss_agg_mode)")),
    ("reward_model.model.*", noop("the reward model's loading options (memory, speed)")),
    ("reward_model.rollout.*", noop("the reward model's serving options (memory, speed)")),
    ("reward_model.*", noop("a memory, speed or profiling option of the reward model")),
    ("actor_rollout_ref.actor.fsdp_config.*", noop("an FSDP option with no counterpart here")),
]
"""Patterns of whole blocks, in order (the first that matches applies)."""


def rule_for(key: str) -> Rule | None:
    """The rule of dotted verl ``key`` (exact, then a pattern, then ``VERL_SECTIONS``), or None."""
    found = RULES.get(key)
    if found is not None:
        return found
    for pattern, rule in PATTERNS:
        if fnmatch.fnmatchcase(key, pattern):
            return rule
    listed = counterpart(key)
    if listed is None:
        return None
    if len(listed.keys) == 1:
        return to(listed.keys[0], why=listed.note)
    return only(listed.note or "no counterpart here")
