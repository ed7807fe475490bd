"""The key contract: every schema field is consumed by rl_runtime.compose, or declared here.

``UNSUPPORTED`` maps a dotted key pattern (``fnmatch``; ``*`` stands for a role-independent part or
a ``custom_envs`` tag) to what is missing: rl_runtime.compose refuses a non-default value with an
error naming the key (before anything starts), and ``rl-config check`` warns about it.
``IGNORED`` maps a pattern to why it has no effect (as ROLL ignores it, or meaningless for the
role): a non-default value is a warning. ``AGENTIC_IGNORED``: keys of other pipelines (RLVR), a
warning only in an agentic config. Both are plain ``{pattern: reason}`` mappings so other
tables (e.g. ROLL-compat ignores) join with ``{**IGNORED, **OTHER}``.

``schema_keys()`` lists every leaf key of the schema (worker sections expanded per role,
``custom_envs.*`` for env definitions); a test checks each is consumed or declared.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any, get_args, get_origin

from pydantic import BaseModel

from rl_config.roll_compat import DPO_KEYS, SFT_KEYS
from rl_config.schema_walk import is_model, unwrap

ROLES = ("actor_train", "actor_infer", "reference", "critic")
_TRAIN_ONLY = (
    "training_args.*",
    "use_dynamic_batching_in_train",
    "max_tokens_per_microbatch_in_train",
    "sequence_length_round_in_train",
    "pg_variant",
    "topr_positive_weight",
    "topr_negative_weight",
    "model_args.disable_gradient_checkpointing",
    "model_args.gradient_checkpointing_use_reentrant",
    "model_args.freeze_module_prefix",
)

_REWARD_WORKER = (
    "this reward domain cannot be built here (rule rewards: math_rule, code_sandbox, format, "
    "custom, verl_default, crossthinkqa; model rewards: llm_judge, reward_model); training "
    "without it would optimise another objective. "
    "Remove the domain (and its tags from the data), or score it with a custom_reward_function"
)

CHANGES_WHAT_IS_TRAINED: dict[str, str] = {
    # reward domains whose scorer does not exist (ROLL's reward worker classes)
    "rewards.*.worker_cls=*GeneralRuleRewardWorker": "IFEval instruction-following rules are "
    "not implemented; " + _REWARD_WORKER,
    "rewards.*.worker_cls=*GeneralValRuleRewardWorker": "ROLL's general validation rules are "
    "not implemented; " + _REWARD_WORKER,
    "rewards.*.worker_cls=*MultipleChoiceBoxedRuleRewardWorker": "multiple-choice rules are not "
    "implemented; " + _REWARD_WORKER,
    "rewards.*.worker_cls=*DetectionRewardWorker": "detection (vision) rewards are not "
    "implemented; " + _REWARD_WORKER,
    "rewards.*.worker_cls=*RemoteRewardSystemWorker": "remote reward systems are not "
    "implemented; " + _REWARD_WORKER,
    # ROLL sections and switches whose omission changes the rewards or the loss
    "reward_model": "ROLL's reward-model worker section is not read: the rewards would come "
    "from the rewards section instead; score with a reward model as a rewards domain "
    "(reward_fn: reward_model, its model_args and device_mapping)",
    "reward": "ROLL's reward worker section is not read: rewards are the rewards section, scored "
    "in the rl-envs sandbox; move its settings there",
    "reward_system_config": "ROLL's remote reward system is not implemented: the rewards would "
    "come from the local rule rewards instead",
    "importance_sampling": "ROLL's importance-sampling switch is not read, so the loss would "
    "differ; use train_infer_correction.is_weight",
    "use_topr_neg_loss_coef": "ROLL's TOPR negative-sample coefficient is not read, so the loss "
    "would differ; use actor_train.pg_variant: topr",
    "error_max_len_clip": "ROLL's clipping of failed long responses is not implemented, so their "
    "rewards would differ; remove it",
    "reward_normalization.norm_mean_type": "ROLL's agentic normalisation scope is not read, so "
    "the advantages would differ; use reward_normalization.grouping and method",
    "reward_normalization.norm_std_type": "ROLL's agentic normalisation scope is not read, so "
    "the advantages would differ; use reward_normalization.grouping and method",
}
"""Keys refused by name when set (not null/false/empty), before anything else is checked:
honouring them is not implemented and leaving them out would change what is trained (the
model's trained weights, its rewards or the objective) rather than how fast. A pattern is a dotted key
(``ROLE`` = a worker section, ``*`` = any one segment), optionally ``=VALUE`` with a shell
pattern the value must match. Lifting a refusal is deleting its entry (and reading the key)."""


UNSUPPORTED: dict[str, str] = {
    "reference.model_args.adapter_name_or_path": "the reference is a plain model (merge the "
    "adapter into a model directory and give that as reference.model_args.model_name_or_path)",
    "*.model_args.model_type": "classification/TRL heads are chosen by role (critic = value head)",
    "*.model_args.num_labels": "the critic's value head has one output",
    "*.model_args.trust_remote_code": "remote model code is never run",
    "*.model_args.gradient_checkpointing_use_reentrant": "checkpointing is always non-reentrant",
    "*.use_dynamic_batching_in_infer": "dynamic batching of forward passes is not implemented",
    "*.max_tokens_per_microbatch_in_infer": "dynamic batching of forward passes is not implemented",
    "*.sequence_length_round_in_train": "micro-batches are padded to their longest row",
    "*.sequence_length_round_in_infer": "micro-batches are padded to their longest row",
    "*.logits_in_fp32": "log-probs are always computed from float32 logits",
    "*.generating_args.num_beams": "beam search is not supported",
    "*.generating_args.num_return_sequences": "agentic rollouts use one sample per env (group_size "
    "gives G)",
    "*.generating_args.include_stop_str_in_output": "a matched stop string always stays in the "
    "output tokens",
    "*.training_args.num_train_epochs": "use ppo_epochs",
    "train_infer_correction.is_weight.detach": "IS weights are always detached",
    "actor_train.num_gpus_per_worker": "training workers use one device each",
    "critic.num_gpus_per_worker": "training workers use one device each",
    "critic.share_prompt_forward": "the critic's value forward has no shared-prompt path",
    "*.topr_positive_weight": "rl_algos' topr loss has no per-sign weights",
    "*.topr_negative_weight": "rl_algos' topr loss has no per-sign weights",
    "l2": "use actor_train.training_args.weight_decay",
    "sft_loss_coef": "an SFT term on positive samples is not implemented",
    "use_topr_loss": "set actor_train.pg_variant: topr",
    "critic_warmup": "critic-only warm-up steps are not implemented",
    "use_reward_scaling": "running reward scaling is not implemented",
    "use_reward_norm": "running reward scaling is not implemented",
    "whiten_rewards": "reward whitening is not implemented (see whiten_advantages)",
    "add_len_reward": "a length reward is not implemented",
    "difficulty_loss_weight": "difficulty loss weighting is not implemented",
    "length_loss_weight": "length loss weighting is not implemented",
    "max_len_mask": "masking truncated responses is not implemented",
    "difficulty_mask": "ROLL's difficulty filter of prompt groups is implemented in the RLVR "
    "pipeline only",
    "difficulty_*_threshold": "ROLL's difficulty filter of prompt groups is implemented in the "
    "RLVR pipeline only",
    "dynamic_sampling.*": "DAPO dynamic sampling is not implemented in the agentic pipeline",
    "overlong_penalty.*": "the DAPO overlong penalty is not implemented in the agentic pipeline",
    "async.max_inflight_samples": "rollout generates one step's batch at a time, so the samples "
    "in flight are one batch (bound the run-ahead with async.queue_size and max_staleness)",
    "is_offload_states": "offloading states between phases is not implemented",
    "train_env_manager.group_size_redundancy": "redundant envs per group are not started",
    "val_env_manager.group_size_redundancy": "redundant envs per group are not started",
    "train_env_manager.max_traj_per_env": "each env plays rollout_batch_size / num_envs episodes",
    "val_env_manager.max_traj_per_env": "each val env plays one episode",
    "custom_envs.*.max_env_step_concurrent": "env steps are not rate-limited per env type",
    "rewards.*.code_url": "code tests run in the local rl-envs sandbox, not a remote one",
    "rewards.*.response_length_penalty_coef": "a length penalty of rule rewards is not "
    "implemented (see overlong_penalty)",
    "rewards.*.query_filter_config": "reward-based prompt filters are not implemented (see "
    "dynamic_sampling)",
    "rewards.*.response_filter_config": "reward-based response filters are not implemented",
    "rewards.*.reward_manager_config": "ROLL reward-system plugins are not implemented",
}

IGNORED: dict[str, str] = {
    # ROLL reward-worker keys (before the role-wide patterns below, which also match them)
    **{
        f"rewards.*.{key}": "rule rewards run in the rl-envs sandbox, not on a reward worker "
        "(model rewards, llm_judge and reward_model, read it)"
        for key in (
            "model_args",
            "data_args",
            "strategy_args",
            "device_mapping",
            "world_size",
            "infer_batch_size",
            "use_local",
        )
    },
    **{
        f"rewards.*.{key}": "only model rewards (llm_judge, reward_model) read it"
        for key in ("generating_args", "judge_*", "reward_normalize")
    },
    # ROLL bookkeeping this stack has no use for
    "local_rank": "set by ROLL's launchers; workers get their rank from the cluster",
    "generate_opt_level": "generation always goes through the request scheduler",
    "checkpoint_config.type": "only file_system exists",
    "*.worker_cls": "workers are chosen by role",
    "*.backend_timeout": "collective timeouts follow rpc_timeout",
    "*.system_envs": "the top-level system_envs apply to every worker",
    "*.world_size": "derived from device_mapping",
    "train_env_manager.max_env_num_per_worker": "envs run inside the rollout workers",
    "val_env_manager.max_env_num_per_worker": "envs run inside the rollout workers",
    "train_env_manager.worker_cls": "ROLL env worker class; accepted for compatibility",
    "val_env_manager.worker_cls": "ROLL env worker class; accepted for compatibility",
    "val_env_manager.format_penalty": "the env's own format_penalty (env_config) applies",
    "train_env_manager.format_penalty": "the env's own format_penalty (env_config) applies",
    "custom_envs.*.env_manager_cls": "ROLL env-manager class; accepted for compatibility",
    "custom_envs.*.use_thread_lock": "ROLL option; accepted for compatibility",
    "custom_envs.*.max_tokens_per_step": "turns use the top-level max_tokens_per_step",
    # parts a role does not use
    "actor_infer.model_args.lora_*": "the engines generate with the weights actor_train syncs "
    "(its adapter merged, or loaded by request with vLLM's strategy_config.enable_lora)",
    "actor_infer.model_args.adapter_name_or_path": "the engines generate with the weights "
    "actor_train syncs (its adapter merged, or loaded by request with vLLM's "
    "strategy_config.enable_lora)",
    "reference.model_args.lora_*": "the reference is not trained (a LoRA actor's reference is "
    "its base model: the actor with its adapter disabled)",
    "actor_infer.infer_batch_size": "the engine batches its requests itself",
    "actor_infer.model_args.attn_implementation": "the engines choose their attention kernel",
    "actor_infer.share_prompt_forward": "only actor_train and reference run log-prob forwards",
    **{f"{role}.generating_args.*": "only actor_infer generates" for role in ROLES[:1] + ROLES[2:]},
    **{
        f"{role}.{key}": "only training roles use it"
        for role in ("actor_infer", "reference")
        for key in _TRAIN_ONLY
    },
    **{f"critic.{key}": "the critic has no policy loss" for key in ("pg_variant", "topr_*")},
}


AGENTIC_IGNORED: dict[str, str] = {
    "val_batch_size": "agentic validation runs val_env_manager's num_env_groups x group_size "
    "episodes",
    "*.data_args.*": "datasets and chat templates are RLVR/DPO settings (agentic prompts come "
    "from the envs)",
    "is_num_return_sequences_expand": "RLVR only (no effect in agentic pipelines)",
    "is_use_additional_prompts": "RLVR only (no effect in agentic pipelines)",
    "max_additional_running_prompts": "RLVR only (no effect in agentic pipelines)",
    "num_return_sequences_in_group": "RLVR only (agentic groups come from group_size)",
    "prompt_length": "RLVR only (agentic prompts come from the envs)",
    "prompt_truncation": "RLVR only (agentic prompts come from the envs)",
    "response_length": "RLVR only (agentic turns use max_tokens_per_step)",
    "reward_pretrain": "it is only the critic's model when critic.model_args.model_name_or_path "
    "is unset, and this config has no such critic (agentic rewards come from the envs)",
    "reward_norm": "RLVR only (agentic pipelines use reward_normalization)",
    "norm_mean_type": "RLVR only (agentic pipelines use reward_normalization)",
    "norm_std_type": "RLVR only (agentic pipelines use reward_normalization)",
    "reward_shift": "RLVR only (agentic pipelines use reward_normalization)",
    "reward_scale": "RLVR only (agentic pipelines use reward_normalization)",
    "rewards.*": "RLVR rule reward domains (agentic rewards come from the envs; a model "
    "reward domain, llm_judge or reward_model, scores episodes at their end)",
    "custom_reward_function.*": "RLVR only (agentic rewards come from the envs)",
    "val_n_sample": "RLVR only (agentic validation plays val_env_manager's episodes)",
    "val_greedy": "RLVR only (agentic apps choose greedy validation themselves)",
    "validation.*": "RLVR only (agentic validation plays val_env_manager's episodes)",
}

_NOT_IN_RLVR = "not implemented in the RLVR pipeline"
RLVR_IGNORED: dict[str, str] = {
    "train_env_manager.*": "agentic only (RLVR prompts come from actor_train.data_args)",
    "val_env_manager.*": "agentic only (RLVR validation uses data_args.eval_file_name)",
    "custom_envs.*": "agentic only (RLVR prompts come from actor_train.data_args)",
    "max_tokens_per_step": "agentic only (RLVR responses use response_length)",
    "render_save_dir": "agentic only (RLVR has no env frames to render)",
    "max_running_requests": "the RLVR recipe sends each rollout batch to the engines at once",
    "reward_pretrain": "it is only the critic's model when critic.model_args.model_name_or_path "
    "is unset, and this config has no such critic; a model reward's model is its domain's "
    "model_args.model_name_or_path (ROLL's examples write ${reward_pretrain} there)",
    "actor_train.training_args.num_train_epochs": "ROLL's RLVR pipeline runs max_steps steps "
    "and repeats the prompts as needed (as ROLL, it does not read it)",
    **{
        f"{role}.data_args.*": "only actor_train.data_args are read (RLVR data and template)"
        for role in ("actor_infer", "reference", "critic")
    },
    "actor_train.data_args.dataset_type": "the loader follows the file extension (.parquet, "
    ".jsonl, .json)",
    "actor_train.data_args.id": "rows are identified by file and row number",
    "actor_train.data_args.preprocessing_num_workers": "prompts are tokenized on the driver",
    "actor_train.data_args.cache_path": "prompts are tokenized on the driver (no cache)",
    **{
        f"validation.data_args.{key}": "held-out rows are read with actor_train.data_args' "
        "columns (as ROLL's RLVR pipeline reads them)"
        for key in ("prompt", "messages", "response", "tag", "id", "domain_interleave_probs")
    },
    "validation.data_args.eval_file_name": "held-out files are validation.data_args.file_name",
    "validation.data_args.dataset_type": "the loader follows the file extension (.parquet, "
    ".jsonl, .json)",
    "validation.data_args.preprocessing_num_workers": "prompts are tokenized on the driver",
    "validation.data_args.cache_path": "prompts are tokenized on the driver (no cache)",
    # RLVR knobs of ROLL this pipeline does not implement (a warning, as ROLL-only keys are)
    "norm_mean_type": f"{_NOT_IN_RLVR}; advantages follow reward_normalization",
    "norm_std_type": f"{_NOT_IN_RLVR}; advantages follow reward_normalization",
    "reward_norm": f"{_NOT_IN_RLVR}; advantages follow reward_normalization",
    "reward_shift": f"{_NOT_IN_RLVR}; advantages follow reward_normalization",
    "reward_scale": f"{_NOT_IN_RLVR}; advantages follow reward_normalization",
    "is_num_return_sequences_expand": "the engines are asked for G samples per prompt",
    "is_use_additional_prompts": f"{_NOT_IN_RLVR}; use dynamic_sampling.enable",
    "max_additional_running_prompts": f"{_NOT_IN_RLVR}; use dynamic_sampling.max_num_gen_batches",
}


PREFERENCE_KEYS = DPO_KEYS
"""Top-level keys only the preference pipeline (apps/dpo) reads (they make a config a DPO one)."""

AGENTIC_IGNORED.update(dict.fromkeys(PREFERENCE_KEYS, "DPO only (offline preference pipeline)"))
RLVR_IGNORED.update(dict.fromkeys(PREFERENCE_KEYS, "DPO only (offline preference pipeline)"))

_NO_ROLLOUT = "the DPO pipeline trains on a fixed preference dataset (no rollout)"
DPO_IGNORED: dict[str, str] = {
    "rollout_batch_size": "the DPO batch is per_device_train_batch_size pairs x "
    "gradient_accumulation_steps x ranks (as ROLL's DPO pipeline)",
    "val_batch_size": "every held-out pair (data_args.eval_file_name) is evaluated",
    "ppo_epochs": "one optimizer step per DPO step (gradient accumulation over the full batch)",
    # every actor_infer key but model_args.model_name_or_path (derived from pretrain)
    "actor_infer.[!m]*": _NO_ROLLOUT,
    "actor_infer.max_*": _NO_ROLLOUT,
    "actor_infer.model_args.[!m]*": _NO_ROLLOUT,
    "actor_infer.model_args.model_[!n]*": _NO_ROLLOUT,
    "critic.*": "DPO has no critic",
    "validation.*": "RLVR only (DPO's held-out pairs come from actor_train.data_args."
    "eval_file_name)",
    "train_env_manager.*": _NO_ROLLOUT,
    "val_env_manager.*": _NO_ROLLOUT,
    "custom_envs.*": _NO_ROLLOUT,
    "reference.data_args.*": "the data comes from actor_train.data_args",
    "actor_train.data_args.dataset_type": "the loader follows the file suffix (.jsonl/.json/"
    ".parquet)",
    "actor_train.data_args.response": "responses come from chosen_key/rejected_key "
    "(completion_key for KTO)",
    "actor_train.data_args.tag": "preference rows have no domain tags",
    "actor_train.data_args.id": "rows are numbered by their position in the file",
    "actor_train.data_args.domain_interleave_probs": "preference rows have no domain tags",
    "actor_train.data_args.preprocessing_num_workers": "rows are tokenized once in the driver",
    "actor_train.data_args.cache_path": "rows are tokenized once per run (no cache)",
    "max_tokens_per_step": _NO_ROLLOUT,
    "max_running_requests": _NO_ROLLOUT,
    "num_return_sequences_in_group": _NO_ROLLOUT,
    "prompt_length": "prompt + response must fit sequence_length (truncation_mode)",
    "prompt_truncation": "prompt + response must fit sequence_length (truncation_mode)",
    "response_length": "prompt + response must fit sequence_length (truncation_mode)",
    "model_update_buffer_size_mb": "no weight sync (no rollout engines)",
    "weight_sync_transport": "no weight sync (no rollout engines)",
    "adv_estimator": "no advantages in DPO",
    "reward_normalization.*": "no rewards in DPO",
    "whiten_advantages": "no advantages in DPO",
    "init_kl_coef": "the KL to the reference is implicit in the preference loss (beta)",
    "add_token_level_kl": "the KL to the reference is implicit in the preference loss (beta)",
    "use_kl_loss": "the KL to the reference is implicit in the preference loss (beta)",
    "kl_loss_coef": "the KL to the reference is implicit in the preference loss (beta)",
    "max_failed_fraction": _NO_ROLLOUT,
    "render_save_dir": _NO_ROLLOUT,
    "async.*": _NO_ROLLOUT,
    "async_generation_ratio": _NO_ROLLOUT,
    "sandbox_allow_weak_isolation": "no untrusted code runs in DPO",
    "reward_pretrain": "no reward model in DPO (the preference labels are the data)",
    "rewards.*": "no rewards in DPO (the preference labels are the data)",
    "custom_reward_function.*": "no rewards in DPO (the preference labels are the data)",
    "val_n_sample": "RLVR only (DPO evaluates every held-out pair once, by its preference loss)",
    "val_greedy": "RLVR only (DPO evaluates held-out pairs without generating)",
    **dict.fromkeys(
        (
            "is_num_return_sequences_expand",
            "is_use_additional_prompts",
            "max_additional_running_prompts",
            "gamma",
            "lambd",
            "pg_clip",
            "pg_clip_low",
            "pg_clip_high",
            "use_pg_clip_range",
            "dual_clip_loss",
            "dual_clip_c",
            "value_clip",
            "kl_penalty",
            "kl_loss_type",
            "target_kl",
            "kl_horizon",
            "adaptive_kl_ctrl",
            "reward_norm",
            "norm_mean_type",
            "norm_std_type",
            "reward_shift",
            "reward_scale",
            "reward_clip",
            "advantage_clip",
            "train_infer_correction.*",
            "episode_reward_weight",
            "step_reward_weight",
            "step_reward_gamma",
            "rl_loss_coef",
            "loss_agg_mode",
            "entropy_loss_coef",
            "actor_train.pg_variant",
        ),
        "an RL (policy-gradient) key: the DPO loss is set by loss_type",
    ),
}
"""Keys with no effect in a DPO config (a warning when set)."""

SFT_TOP_KEYS = (*SFT_KEYS, "global_template")
"""Top-level keys only the SFT pipeline (apps/sft) reads."""
_SFT_ONLY = "SFT only (set ROLE.data_args.template for a chat template)"
for _table in (AGENTIC_IGNORED, RLVR_IGNORED, DPO_IGNORED):
    _table.update(dict.fromkeys(SFT_TOP_KEYS, _SFT_ONLY))
    _table["*.use_sequence_packing"] = "SFT only (other pipelines pack with " + (
        "strategy_config.packed_forward)"
    )


def _sft_reason(dpo_reason: str) -> str:
    """A DPO_IGNORED reason for the same key in an SFT config (both train on fixed data)."""
    if "loss_type" in dpo_reason:
        return (
            "an RL (policy-gradient) key: SFT minimises the trained tokens' negative log-likelihood"
        )
    if "preference labels" in dpo_reason or "no rewards" in dpo_reason:
        return "no rewards in SFT (the responses are the data)"
    if dpo_reason.startswith("RLVR only"):
        return "RLVR only (SFT evaluates the held-out loss, without generating)"
    if "truncation_mode" in dpo_reason:
        return "an example must fit sequence_length (a longer one keeps its start)"
    text = dpo_reason.replace("fixed preference dataset", "fixed dataset")
    return text.replace("DPO pipeline", "SFT pipeline").replace("DPO", "SFT")


SFT_IGNORED: dict[str, str] = {
    **{
        k: _sft_reason(v)
        for k, v in DPO_IGNORED.items()
        if k not in ("validation.*", "reward_pretrain", *SFT_TOP_KEYS, "*.use_sequence_packing")
        and not k.startswith("actor_train.data_args.")
        and k not in ("init_kl_coef", "add_token_level_kl", "use_kl_loss", "kl_loss_coef")
    },
    "rollout_batch_size": "the SFT batch is per_device_train_batch_size rows x "
    "gradient_accumulation_steps x ranks (as ROLL's SFT pipeline)",
    "val_batch_size": "every held-out row is evaluated",
    "ppo_epochs": "one optimizer step per SFT step (gradient accumulation over the full batch)",
    **dict.fromkeys(PREFERENCE_KEYS, "DPO only (offline preference pipeline)"),
    # every reference key but model_args.model_name_or_path (derived from pretrain)
    "reference.[!m]*": "SFT trains without a reference model",
    "reference.model_args.[!m]*": "SFT trains without a reference model",
    "reference.model_args.model_[!n]*": "SFT trains without a reference model",
    "init_kl_coef": "SFT has no KL term (no reference model)",
    "add_token_level_kl": "SFT has no KL term (no reference model)",
    "use_kl_loss": "SFT has no KL term (no reference model)",
    "kl_loss_coef": "SFT has no KL term (no reference model)",
    "reward_pretrain": "no reward model in SFT",
    "actor_train.data_args.eval_file_name": "held-out rows come from validation.data_args."
    "file_name (as ROLL's SFT pipeline)",
    "actor_train.data_args.dataset_type": "the loader follows the file suffix (.jsonl/.json/"
    ".parquet)",
    "actor_train.data_args.prompt": "prompt/response rows use prompt_key, query_key, "
    "response_key and system_key",
    "actor_train.data_args.response": "prompt/response rows use response_key",
    "actor_train.data_args.tag": "SFT rows have no domain tags",
    "actor_train.data_args.id": "rows are numbered by their position in the file",
    "actor_train.data_args.domain_interleave_probs": "SFT rows have no domain tags",
    "actor_train.data_args.preprocessing_num_workers": "rows are tokenized once in the driver",
    "actor_train.data_args.cache_path": "rows are tokenized once per run (no cache)",
    "validation.generating_args.*": "SFT evaluates the held-out loss (nothing is generated)",
    "validation.eval_steps": "evaluation runs every top-level eval_steps",
    **{
        f"validation.data_args.{key}": "held-out rows are read with the training columns "
        "(prompt_key, response_key, actor_train.data_args.messages)"
        for key in (
            "prompt",
            "messages",
            "response",
            "tag",
            "id",
            "domain_interleave_probs",
            "eval_file_name",
            "dataset_type",
            "preprocessing_num_workers",
            "cache_path",
        )
    },
}
"""Keys with no effect in an SFT config (a warning when set)."""

PIPELINE_IGNORED: dict[str, dict[str, str]] = {
    "agentic": AGENTIC_IGNORED,
    "rlvr": RLVR_IGNORED,
    "dpo": DPO_IGNORED,
    "sft": SFT_IGNORED,
}
"""Per pipeline kind: keys of other pipelines, a warning only in a config of that kind."""

PIPELINE_CONSUMED: dict[str, tuple[str, ...]] = {
    # read by rl_runtime.pipelines.rlvr.compose (apps/rlvr); rl_envs.rewards.router.reward_router_spec
    # reads worker_cls to pick a domain's reward
    "rlvr": (
        "rewards.*.worker_cls",
        "rewards.*.reward_type",
        "dynamic_sampling.*",
        "overlong_penalty.*",
        "max_len_mask",
        "difficulty_mask",
        "difficulty_low_threshold",
        "difficulty_high_threshold",
        "val_batch_size",
        "val_n_sample",
        "val_greedy",
        "prompt_length",
        "prompt_truncation",
        "response_length",
        "num_return_sequences_in_group",
        "actor_infer.generating_args.num_return_sequences",
        "actor_train.data_args.template",
        "actor_train.data_args.file_name",
        "actor_train.data_args.eval_file_name",
        "actor_train.data_args.prompt",
        "actor_train.data_args.messages",
        "actor_train.data_args.response",
        "actor_train.data_args.tag",
        "actor_train.data_args.domain_interleave_probs",
        "validation.data_args.file_name",
        "validation.data_args.template",
        "validation.eval_steps",
        *(
            f"validation.generating_args.{key}"
            for key in (
                "max_new_tokens",
                "temperature",
                "top_p",
                "top_k",
                "num_return_sequences",
                "repetition_penalty",
                "do_sample",
                "stop_strings",
            )
        ),
    ),
}
PIPELINE_CONSUMED["sft"] = (
    # read by rl_runtime.pipelines.sft.compose (apps/sft)
    "actor_train.training_args.num_train_epochs",
    "actor_train.use_sequence_packing",
    "validation.data_args.file_name",
    "validation.data_args.template",
)
"""Per pipeline kind: key patterns that pipeline consumes although ``UNSUPPORTED`` or ``IGNORED``
declare them for the others (e.g. RLVR's ``dynamic_sampling.*``)."""


_TEACHER = "distill_app.teachers.NAME"
_OFF = "distill_app.off_policy"
DISTILL_KEYS: dict[str, str] = {
    # ROLL's distillation keys (outside the experiment schema) -> what apps/distill reads them as
    # once `rl-config convert` has rewritten the config (rl_config.convert_opd, convert_ofd); a
    # config that still holds them is refused, naming the command (rl_config.roll_keys)
    "teacher": f"{_TEACHER}: one section (named default) or a mapping of named teachers; each "
    "on workers of its own (role teacher_NAME), running the reference section's strategy",
    "teacher.model_args.model_name_or_path": f"{_TEACHER}.model (unset: teacher_pretrain, or "
    "pretrain on-policy)",
    "teacher.model_args.dtype": f"{_TEACHER}.dtype (fp32, bf16, fp16)",
    "teacher.device_mapping": f"{_TEACHER}.device_mapping (unset: the reference's)",
    "teacher.infer_batch_size": f"{_TEACHER}.infer_batch_size (its forward micro-batch)",
    "teacher.training_args.per_device_train_batch_size": f"offline: {_TEACHER}.infer_batch_size "
    "(ROLL's teacher forward micro-batch)",
    "teacher.tag_included": f"{_TEACHER}.tags: the row tags the teacher teaches (none: every row)",
    "teacher.opd_kl_coef": f"{_TEACHER}.kl_coef: its per-token reverse KL's weight on its rows",
    "teacher.strategy_args": "reference.strategy_args (the first teacher's; every teacher runs it)",
    "teacher_pretrain": f"offline: {_TEACHER}.model",
    "student_pretrain": "offline: pretrain",
    "student": "offline: actor_train",
    "student_train": "on-policy: actor_train",
    "student_infer": "on-policy: actor_infer",
    "is_pure_opd": "on-policy: dropped (apps/distill is pure on-policy distillation)",
    "use_opd": "refused: ROLL's mixed OPD (RL rewards plus the teacher KL) is not implemented",
    "pure_opd_pipeline_type": "on-policy: rlvr only (agentic OPD is not implemented)",
    "question_key": f"offline: {_OFF}.prompt_key",
    "answer_key": f"offline: {_OFF}.response_key",
    "kd_objective": f"offline: {_OFF}.kd_objective (forward_kl, reverse_kl, adaptive_kl, "
    "skewed_forward_kl, skewed_reverse_kl, js_divergence: rl_algos.distill.KD_OBJECTIVES)",
    "logits_topk": f"offline: {_OFF}.logits_topk (the teacher's top-k ids; 0: the whole vocabulary)",
    "kd_temperature": f"offline: {_OFF}.kd_temperature (divides the student's and the teacher's logits)",
    "teacher_temperature": f"offline: {_OFF}.teacher_temperature (divides the teacher's logits too)",
    "distill_loss_weight": f"offline: {_OFF}.distill_loss_weight (the divergence's share; the "
    "NLL's is 1 - it)",
    "adaptive_kl_alpha": f"offline: {_OFF}.adaptive_kl_alpha (adaptive_kl's tail mass)",
    "skew_lambda": f"offline: {_OFF}.skew_lambda (the skewed KLs' mixing weight)",
    "distill_on_prompt": f"offline: {_OFF}.distill_on_prompt (train on the prompt tokens too)",
    "logits_transfer_backend": "offline: dropped (the teacher's top-k reaches the student "
    "through the driver)",
}
"""ROLL's distillation keys -> where apps/distill reads them (docs/config.md lists them)."""


def declared(key: str, pipeline: str | None = None) -> tuple[str, str] | None:
    """``("unsupported" | "ignored", reason)`` for a dotted key, or None (consumed); with a
    ``pipeline`` kind, the keys that pipeline consumes are None and only its own
    ``PIPELINE_IGNORED`` table applies (without one: every pipeline's table)."""
    if pipeline is not None and declared_in(
        key, dict.fromkeys(PIPELINE_CONSUMED.get(pipeline, ()))
    ):
        return None
    others = (
        [PIPELINE_IGNORED.get(pipeline, {})] if pipeline is not None else PIPELINE_IGNORED.values()
    )
    # a pipeline's own table first: it may downgrade a key the others refuse (RLVR ignores
    # num_train_epochs as ROLL's RLVR pipeline does)
    tables = [("ignored", t) for t in others] if pipeline is not None else []
    tables += [("unsupported", UNSUPPORTED), ("ignored", IGNORED)]
    if pipeline is None:
        tables += [("ignored", t) for t in others]
    for kind, table in tables:
        for pattern, reason in table.items():
            if fnmatchcase(key, pattern):
                return kind, reason
    return None


def declared_in(key: str, table: dict[str, str]) -> bool:
    return any(fnmatchcase(key, p) for p in table)


def schema_keys(model: type[BaseModel] | None = None, prefix: str = "") -> list[str]:
    """Every leaf key of the schema: nested models expanded, worker sections per role,
    ``dict[str, Model]`` values as ``key.*.field``; lists and plain dicts are leaves."""
    if model is None:
        from rl_config.schema import ExperimentConfig

        model = ExperimentConfig
    out: list[str] = []
    for name, info in model.model_fields.items():
        key = f"{prefix}{info.alias or name}"
        ann = unwrap(info.annotation)
        if is_model(ann):
            out += schema_keys(ann, key + ".")
            continue
        args = get_args(ann)
        if get_origin(ann) is dict and len(args) == 2 and is_model(unwrap(args[1])):
            out += schema_keys(unwrap(args[1]), key + ".*.")
            continue
        out.append(key)
    return out


_BASELINE: list[Any] = []


def _baseline() -> Any:
    """A derived all-defaults experiment (derived values filled in), built once."""
    if not _BASELINE:
        from rl_config.schema import ExperimentConfig

        _BASELINE.append(None)  # guard: validating the baseline runs the rules again
        try:
            _BASELINE[0] = ExperimentConfig.model_validate({"pretrain": "baseline"})
        except BaseException:
            _BASELINE.clear()
            raise
    return _BASELINE[0]


def _leaf_values(obj: BaseModel, prefix: str = "") -> list[tuple[str, str, Any, Any]]:
    """``(concrete key, pattern key, value, field default)`` of every leaf set in ``obj``."""
    from rl_config.schema_walk import default_of

    out = []
    for name, info in type(obj).model_fields.items():
        key = f"{prefix}{info.alias or name}"
        value = getattr(obj, name)
        if isinstance(value, BaseModel):
            out += _leaf_values(value, key + ".")
        elif (
            isinstance(value, dict)
            and value
            and all(isinstance(v, BaseModel) for v in value.values())
        ):
            for tag, item in value.items():
                out += [
                    (f"{key}.{tag}.{k[len(key) + 3 :]}", k, v, d)
                    for k, _, v, d in _leaf_values(item, key + ".*.")
                ]
        else:
            out.append((key, key, value, default_of(info)))
    return out


def _baseline_value(key: str) -> Any:
    node: Any = _baseline()
    for part in key.split("."):
        if node is None or not isinstance(node, BaseModel):
            return _MISSING
        field = next(
            (n for n, i in type(node).model_fields.items() if (i.alias or n) == part), None
        )
        if field is None:
            return _MISSING
        node = getattr(node, field)
    return node


_MISSING = object()


def _pipeline_specific(pattern: str) -> bool:
    return any(declared_in(pattern, t) for t in PIPELINE_IGNORED.values())


def pipeline_kind(cfg: BaseModel) -> str | None:
    """The pipeline a config is for: the validated config's own `pipeline_kind` (agentic with
    env managers, dpo, else rlvr), or by its sections (env managers: agentic) for other models."""
    kind = getattr(cfg, "pipeline_kind", None)
    if isinstance(kind, str):
        return kind
    return "agentic" if getattr(cfg, "train_env_manager", None) is not None else None


def _model_reward_keys(cfg: BaseModel) -> set[str]:
    """The ``rewards.<domain>.<field>`` keys a model reward's domain reads (``llm_judge``,
    ``reward_model``: rl_runtime.compose.model_rewards reads ``MODEL_REWARD_FIELDS``, which a
    rule domain ignores, and the keys that choose the model and its rows: in an agentic config,
    where rule domains have no effect, a model domain scores episodes at their end)."""
    from rl_config.schema.rewards import MODEL_REWARD_FIELDS

    rewards = getattr(cfg, "rewards", None) or {}
    chosen_by = ("reward_fn", "worker_cls", "tag_included", "timeout_s")
    return {
        f"rewards.{domain}.{field}"
        for domain, section in rewards.items()
        if section.model_reward(domain) is not None
        for field in (*MODEL_REWARD_FIELDS, *chosen_by)
    }


def _critic_model_keys(cfg: BaseModel) -> set[str]:
    """``reward_pretrain`` where it is the critic's model (the schema makes it the default of
    ``critic.model_args.model_name_or_path``)."""
    critic = getattr(cfg, "critic", None)
    chosen = getattr(getattr(critic, "model_args", None), "model_name_or_path", None)
    used = critic is not None and chosen == getattr(cfg, "reward_pretrain", None)
    return {"reward_pretrain"} if used else set()


def contract_issues(
    cfg: BaseModel, pipeline: str | None = None
) -> tuple[list[tuple[str, str]], list[str]]:
    """``(errors as (key, message), warnings)`` for the declared keys set to a non-default value,
    for the ``pipeline`` kind (default: `pipeline_kind(cfg)`; None: any pipeline's keys pass)."""
    if _BASELINE and _BASELINE[0] is None:
        return [], []
    errors: list[tuple[str, str]] = []
    warnings: list[str] = []
    pipeline = pipeline or pipeline_kind(cfg)
    model_fields = _model_reward_keys(cfg) if pipeline in (None, "rlvr", "agentic") else set()
    model_fields |= _critic_model_keys(cfg)
    for key, pattern, value, default in _leaf_values(cfg):
        found = declared(pattern, pipeline) or declared(key, pipeline)
        if found is None or key in model_fields:
            continue
        base = _baseline_value(key)
        if value == (default if base is _MISSING else base) or (value == default):
            continue
        kind, reason = found
        if kind == "ignored" and pipeline is None and _pipeline_specific(pattern):
            continue
        if kind == "unsupported":
            errors.append((key, f"{value!r} is not supported: {reason}"))
        else:
            warnings.append(f"{key}={value!r} has no effect: {reason}")
    return errors, warnings


def changes_what_is_trained(data: Any) -> list[Any]:
    """One ``ConfigIssue`` per key of the raw config mapping ``data`` that
    ``CHANGES_WHAT_IS_TRAINED`` refuses (a set value only)."""
    from rl_config.errors import ConfigIssue
    from rl_config.roll_keys import matches

    issues: list[ConfigIssue] = []

    def walk(node: Any, prefix: str) -> None:
        if not isinstance(node, dict):
            return
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            reason = _refusal(path, value)
            if reason is not None:
                issues.append(ConfigIssue(path, f"{value!r} is refused: {reason}"))
            else:
                walk(value, path)

    def _refusal(path: str, value: Any) -> str | None:
        if value is None or value is False or value in ({}, [], ""):
            return None
        for pattern, reason in CHANGES_WHAT_IS_TRAINED.items():
            key, _, want = pattern.partition("=")
            if matches(key, path) and (not want or fnmatchcase(str(value), want)):
                return reason
        return None

    walk(data, "")
    return issues
