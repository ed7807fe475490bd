"""Worker sections: ``actor_train``, ``actor_infer``, ``reference``, ``critic`` (ROLL's WorkerConfig)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from rl_config.ranges import parse_device_list
from rl_config.schema.base import StrictModel

TRAIN_STRATEGIES = ("deepspeed_train", "fsdp2_train")
"""Strategies that can train (actor_train, critic)."""
INFER_STRATEGIES = ("vllm", "hf_infer", "replay")
"""Strategies that can generate (actor_infer); `replay` serves recorded generations
(rl_rollout.replay_engine)."""
FORWARD_STRATEGIES = ("hf_infer", "deepspeed_train", "fsdp2_train")
"""Strategies that can compute log-probs without training (reference)."""
KNOWN_UNSUPPORTED_STRATEGIES = (
    "megatron_train",
    "megatron_infer",
    "sglang",
    "deepspeed_infer",
    "fsdp2_infer",
    "diffusion_deepspeed_train",
)
"""ROLL strategy names this stack does not implement (rejected with a hint)."""

FSDP2_OPTIONS: dict[str, str] = {
    "param_dtype": "compute dtype of sharded parameters: fp32, bf16 or fp16 (default: model dtype)",
    "reduce_dtype": "gradient reduction dtype: fp32 (default), bf16 or fp16",
    "cpu_offload": "true: keep parameters and optimizer states on the CPU (ROLL: offload_policy)",
    "reshard_after_forward": "free gathered parameters after forward (default true)",
    "gradient_checkpointing": "activation checkpointing override",
    "keep_last": "checkpoints kept by the backend",
    "packed_forward": "pack sequences without padding in forward",
    "offload_reference": "reference role: offload its parameters between uses",
    "fused_lm_head": "log-probs from hidden states without [N, V] logits (default: on for "
    "GPUs/NPUs, off on the CPU)",
    "compile_layers": "torch.compile each decoder layer's forward (fuses norms, rotary and "
    "activations; default false)",
}
"""strategy_config keys of fsdp2_train (rl_train.backends.native._FSDP_KEYS; a test keeps them equal)."""
DTYPE_NAMES = ("fp32", "bf16", "fp16")

PolicyLossName = Literal[
    "ppo_clip", "gspo", "cispo", "gmpo", "clip_cov", "kl_cov", "sapo", "topr", "reinforce"
]


class ModelArgs(StrictModel):
    """How to load the model of a worker (ROLL ``model_args``)."""

    model_name_or_path: str | None = Field(
        default=None,
        description="Local path or hub id of the model. Unset: `pretrain` for actor_train, "
        "actor_infer and reference; `reward_pretrain` (else `pretrain`) for critic.",
    )
    adapter_name_or_path: str | None = Field(
        default=None,
        description="Local peft adapter directory (adapter_model.safetensors) to start a trained "
        "role's LoRA from; its own rank, alpha and targets apply (turns LoRA on).",
    )
    lora_target: str | list[str] | None = Field(
        default=None,
        description="Turns LoRA on for a trained role (actor_train, critic): all-linear, a "
        "comma-separated list of module names (q_proj,v_proj), or a regular expression. Only "
        "the adapters train; a reference that is the base model is the actor with its adapter "
        "disabled (no reference worker).",
    )
    lora_rank: int | None = Field(
        default=None, ge=1, description="LoRA rank r (default 8 when lora_target is set)."
    )
    lora_alpha: float | None = Field(
        default=None,
        gt=0,
        description="LoRA scale numerator: updates are scaled by lora_alpha / lora_rank "
        "(default 2 x lora_rank).",
    )
    lora_dropout: float | None = Field(
        default=None, ge=0, lt=1, description="Dropout on the LoRA input (default 0)."
    )
    attn_implementation: Literal["eager", "sdpa", "fa2", "flash_attention_2", "auto"] | None = (
        Field(
            default=None,
            description="Attention kernel: eager, sdpa, fa2 (= flash_attention_2, CUDA only), auto. "
            "Unset: the backend picks (sdpa where available).",
        )
    )
    disable_gradient_checkpointing: bool = Field(
        default=False,
        description="Turn off activation (gradient) checkpointing; uses more memory, runs faster. "
        "Training workers only.",
    )
    gradient_checkpointing_use_reentrant: bool | None = Field(
        default=None,
        description="torch.utils.checkpoint use_reentrant flag; unset: backend default.",
    )
    dtype: Literal["fp32", "bf16", "fp16"] = Field(
        default="fp32",
        description="Parameter/compute dtype: fp32, bf16 or fp16. Default fp32 (exact on CPU); set "
        "bf16 on GPUs/NPUs.",
    )
    model_type: (
        Literal["auto_sequence_classification", "auto_token_classification", "trl"] | None
    ) = Field(
        default=None,
        description="Head of the model: unset = causal LM; auto_token_classification = "
        "per-token scalar head (critic values); auto_sequence_classification = reward model.",
    )
    num_labels: int = Field(
        default=1, ge=1, description="Number of outputs of a classification head (critic: 1)."
    )
    model_config_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="HF model config attributes set before the weights load, e.g. "
        "{max_position_embeddings: 32768}: in the trainers, the rollout engines (vLLM: "
        "hf_overrides) and the exported config.json. A name the model's config does not have is "
        "an error naming it.",
    )
    freeze_module_prefix: str | None = Field(
        default=None,
        description="Comma-separated parameter-name prefixes to freeze (training roles): those "
        "parameters get requires_grad False and stay out of the optimizer (FSDP2, DeepSpeed, "
        "hf_infer); a prefix that matches no parameter is an error when the model loads.",
    )
    trust_remote_code: bool = Field(
        default=False,
        description="Allow model repos to run their own Python code when loading (off by default: "
        "only enable for repos you trust).",
    )


class TrainingArgs(StrictModel):
    """Optimizer and micro-batching of a training worker (ROLL ``training_args``)."""

    learning_rate: float = Field(default=1.0e-6, gt=0, description="Peak learning rate of AdamW.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW decoupled weight decay.")
    adam_beta1: float = Field(default=0.9, ge=0, lt=1, description="AdamW beta1.")
    adam_beta2: float = Field(default=0.999, ge=0, lt=1, description="AdamW beta2.")
    adam_epsilon: float = Field(default=1.0e-8, gt=0, description="AdamW epsilon.")
    per_device_train_batch_size: int = Field(
        default=1,
        ge=1,
        description="Micro-batch size in samples (sequences) per training rank per forward/backward.",
    )
    gradient_accumulation_steps: int = Field(
        default=1,
        ge=1,
        description="Micro-batches accumulated per optimizer step. One optimizer step consumes "
        "per_device_train_batch_size × gradient_accumulation_steps × world_size samples.",
    )
    warmup_steps: int = Field(
        default=0,
        ge=0,
        description="Linear warmup length in optimizer steps (wins over warmup_ratio).",
    )
    warmup_ratio: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Warmup as a fraction of all optimizer steps (if warmup_steps=0).",
    )
    lr_scheduler_type: Literal[
        "constant", "constant_with_warmup", "linear", "cosine", "cosine_with_min_lr"
    ] = Field(default="constant", description="Learning-rate schedule after warmup.")
    lr_scheduler_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra scheduler arguments (e.g. {min_lr_rate: 0.1} for cosine_with_min_lr).",
    )
    num_train_epochs: int = Field(
        default=1,
        ge=1,
        description="Passes over each rollout batch per pipeline step for this worker; SFT: "
        "passes over the training rows (steps = epochs x rows // rows per step, as ROLL).",
    )


class DataArgs(StrictModel):
    """Prompt construction and dataset files (ROLL ``data_args``)."""

    template: str = Field(
        default="native",
        description="Chat template: `native` uses tokenizer.apply_chat_template; other names "
        "(e.g. qwen2_5) select a named template of the rollout package.",
    )
    file_name: str | list[str] | None = Field(
        default=None, description="Training data file(s): JSON, JSONL, CSV or parquet (RLVR/DPO)."
    )
    eval_file_name: str | list[str] | None = Field(
        default=None, description="Validation data file(s)."
    )
    dataset_type: str | list[str] = Field(default="json", description="Loader type of file_name.")
    prompt: str | None = Field(
        default=None, description="Column holding the prompt text (exclusive with `messages`)."
    )
    messages: str | None = Field(
        default=None, description="Column holding chat messages (exclusive with `prompt`)."
    )
    response: str = Field(
        default="solution", description="Column holding the reference answer/label."
    )
    tag: str = Field(default="tag", description="Column holding the domain tag of a row.")
    id: str = Field(default="id", description="Column holding the row id.")
    domain_interleave_probs: dict[str, float] | None = Field(
        default=None, description="Sampling probability per domain tag within one batch."
    )
    preprocessing_num_workers: int | None = Field(
        default=None, ge=1, description="Processes used to tokenize the dataset."
    )
    cache_path: str | None = Field(
        default=None, description="Directory for the preprocessed-dataset cache."
    )


class GeneratingArgs(StrictModel):
    """Sampling of the inference worker (ROLL ``generating_args``)."""

    max_new_tokens: int = Field(
        default=128,
        ge=1,
        description="Tokens generated per request at most (agentic: per env step / turn).",
    )
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature; 0 = greedy.")
    top_p: float = Field(
        default=1.0, gt=0, le=1, description="Nucleus sampling mass; 1.0 disables."
    )
    top_k: int = Field(default=-1, ge=-1, description="Top-k truncation; -1 (or 0) disables.")
    num_beams: int = Field(default=1, ge=1, description="Beam search is not supported: must be 1.")
    num_return_sequences: int = Field(
        default=1,
        ge=1,
        description="Samples per request. Agentic pipelines use 1 (group_size gives G); RLVR "
        "uses num_return_sequences_in_group.",
    )
    repetition_penalty: float = Field(
        default=1.0, gt=0, description="Repetition penalty; 1.0 disables."
    )
    do_sample: bool = Field(default=True, description="Sample (true) or decode greedily (false).")
    stop_strings: list[str] | None = Field(
        default=None, description="Generation stops after any of these strings."
    )
    include_stop_str_in_output: bool = Field(
        default=True, description="Keep a matched stop string in the output tokens."
    )


class StrategyArgs(StrictModel):
    """Which backend runs the worker and its backend-specific options."""

    strategy_name: str = Field(
        default=...,
        description="Backend. Training (actor_train, critic): deepspeed_train | fsdp2_train. "
        "Generation (actor_infer): vllm | hf_infer | replay (recorded generations served "
        "again, strategy_config.generations). Reference: hf_infer | deepspeed_train | "
        "fsdp2_train. megatron_*, sglang, *_infer variants of ROLL are not supported.",
    )
    strategy_config: dict[str, Any] | None = Field(
        default=None,
        description="Options passed to the backend: a DeepSpeed config (e.g. ${deepspeed_zero3}; "
        "`auto` values are filled from training_args), FSDP2 options, or vLLM engine options "
        "(gpu_memory_utilization, block_size, max_model_len, tensor_parallel_size, "
        "enable_prefix_caching, load_format ...).",
    )


class WorkerConfig(StrictModel):
    """One role's cluster of workers: model, optimizer, sampling, backend and devices."""

    model_args: ModelArgs = Field(default_factory=ModelArgs, description="Model loading options.")
    training_args: TrainingArgs = Field(
        default_factory=TrainingArgs, description="Optimizer and micro-batching (training roles)."
    )
    data_args: DataArgs = Field(
        default_factory=DataArgs, description="Template and dataset columns."
    )
    generating_args: GeneratingArgs | None = Field(
        default=None, description="Sampling options (actor_infer; unset: defaults)."
    )
    strategy_args: StrategyArgs | None = Field(
        default=None,
        description="Backend; unset: fsdp2_train for actor_train/critic, hf_infer for "
        "actor_infer/reference.",
    )
    device_mapping: list[int] | None = Field(
        default=None,
        description="Accelerator ids this role uses, e.g. `list(range(0,2))` or [0, 1] (parsed "
        "without eval). Ids count across nodes: node n owns n*num_gpus_per_node .. "
        "(n+1)*num_gpus_per_node-1. Unset: the role runs on CPU.",
    )
    num_gpus_per_worker: int = Field(
        default=1,
        ge=1,
        description="Devices per worker (inference only; vllm: tensor_parallel_size × "
        "pipeline_parallel_size). Training workers use one device each.",
    )
    world_size: int | None = Field(
        default=None,
        ge=1,
        description="Number of workers (ranks). With device_mapping it is derived "
        "(len(device_mapping) / num_gpus_per_worker); on CPU (no device_mapping) default 1.",
    )
    infer_batch_size: int = Field(
        default=4, ge=1, description="Samples per forward pass when computing log-probs/values."
    )
    backend_timeout: int = Field(
        default=30, ge=1, description="Timeout of the worker's collective backend, in minutes."
    )
    system_envs: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables set in this role's processes (merged over the "
        "top-level system_envs).",
    )
    pg_variant: PolicyLossName | None = Field(
        default=None,
        description="Policy loss of actor_train (rl_algos registry name): ppo_clip (alias ppo), "
        "gspo, cispo, gmpo, clip_cov, kl_cov, sapo, topr, reinforce. Unset: ppo_clip.",
    )
    topr_positive_weight: float = Field(
        default=1.0, ge=0, description="TOPR loss weight of positive-reward samples."
    )
    topr_negative_weight: float = Field(
        default=1.0, ge=0, description="TOPR loss weight of negative-reward samples."
    )
    use_sequence_packing: bool = Field(
        default=False,
        description="SFT: train on packed micro-batches (padding removed, the rows concatenated "
        "with position ids restarting per row, so no row attends to another); other pipelines "
        "pack with strategy_config.packed_forward.",
    )
    use_dynamic_batching_in_train: bool = Field(
        default=False,
        description="Pack training micro-batches by a token budget instead of a sample count.",
    )
    max_tokens_per_microbatch_in_train: int = Field(
        default=0,
        ge=0,
        description="Token budget of a training micro-batch (dynamic batching); must be >= "
        "sequence_length.",
    )
    sequence_length_round_in_train: int = Field(
        default=8, ge=1, description="Pad micro-batch lengths up to a multiple of this (tokens)."
    )
    share_prompt_forward: bool = Field(
        default=False,
        description="actor_train and reference: run each distinct prompt of a micro-batch once "
        "and reuse its KV cache for every row that starts with it (GRPO samples each prompt "
        "num_return_sequences_in_group times), in the training forward and the log-prob forwards. "
        "Same log-probs and gradients on the response tokens; needs attn_implementation sdpa or "
        "eager and no packed_forward; not for the critic.",
    )
    use_dynamic_batching_in_infer: bool = Field(
        default=False, description="Pack forward-only micro-batches by a token budget."
    )
    max_tokens_per_microbatch_in_infer: int = Field(
        default=0,
        ge=0,
        description="Token budget of a forward-only micro-batch (dynamic batching).",
    )
    sequence_length_round_in_infer: int = Field(
        default=8,
        ge=1,
        description="Pad forward micro-batch lengths up to a multiple of this (tokens).",
    )
    logits_in_fp32: bool = Field(
        default=True, description="Compute log-probs/entropy from float32 logits."
    )
    worker_cls: str | None = Field(
        default=None,
        description="ROLL worker class path. Accepted so ROLL configs load; this stack chooses "
        "workers by role and ignores it.",
    )

    @field_validator("device_mapping", mode="before")
    @classmethod
    def _parse_device_mapping(cls, value: Any) -> Any:
        if value is None:
            return None
        try:
            return parse_device_list(value)
        except ValueError as exc:
            raise ValueError(
                f"not a device list ({exc}); use list(range(a, b[, step])), [i, j, ...] or an "
                "integer (the text is parsed, never evaluated)"
            ) from None

    @field_validator("pg_variant", mode="before")
    @classmethod
    def _alias_ppo(cls, value: Any) -> Any:
        return "ppo_clip" if value in ("ppo", "vanilla") else value

    @field_validator("system_envs", mode="before")
    @classmethod
    def _stringify_envs(cls, value: Any) -> Any:
        return stringify_env_values(value)


def stringify_env_values(value: Any) -> Any:
    """Environment values must be strings; YAML scalars (1, true) are converted, others kept."""
    if not isinstance(value, dict):
        return value
    out: dict[Any, Any] = {}
    for key, item in value.items():
        if isinstance(item, bool):
            out[key] = "1" if item else "0"
        elif isinstance(item, int | float):
            out[key] = str(item)
        else:
            out[key] = item
    return out
