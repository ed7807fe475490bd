"""verl's top-level config sections, for the error a verl-style key gets.

This stack reads ROLL's key names; it has no verl importer. A verl user who passes verl's
overrides (``data.train_files=...``, ``actor_rollout_ref.rollout.n=5``) gets, per verl section,
"unknown key" with the ROLL keys that hold the same settings (``VERL_SECTIONS``), instead of a
misleading "did you mean" (``trainer`` -> ``pretrain``). Every key named on the right is a schema
key (a test checks).
"""

from __future__ import annotations

VERL_SECTIONS: dict[str, dict[str, str]] = {
    "data": {
        "train_files": "actor_train.data_args.file_name",
        "val_files": "actor_train.data_args.eval_file_name",
        "train_batch_size": "rollout_batch_size",
        "max_prompt_length": "prompt_length",
        "max_response_length": "response_length",
    },
    "actor_rollout_ref": {
        "model.path": "pretrain",
        "rollout.n": "num_return_sequences_in_group",
        "rollout.name": "actor_infer.strategy_args.strategy_name",
        "actor.optim.lr": "actor_train.training_args.learning_rate",
        "actor.ppo_micro_batch_size_per_gpu": "actor_train.training_args.per_device_train_batch_size",
        "actor.use_kl_loss": "use_kl_loss",
        "actor.kl_loss_coef": "kl_loss_coef",
        "actor.kl_loss_type": "kl_loss_type",
        "actor.entropy_coeff": "entropy_loss_coef",
    },
    "algorithm": {
        "adv_estimator": "adv_estimator",
        "gamma": "gamma",
        "lam": "lambd",
        "use_kl_in_reward": "add_token_level_kl",
        "kl_ctrl.kl_coef": "init_kl_coef",
        "kl_penalty": "kl_penalty",
    },
    "trainer": {
        "total_training_steps": "max_steps",
        "save_freq": "save_steps",
        "test_freq": "eval_steps",
        "n_gpus_per_node": "num_gpus_per_node",
        "nnodes": "num_nodes",
        "logger": "track_with",
        "experiment_name": "exp_name",
        "critic_warmup": "critic_warmup",
    },
    "reward_manager": {},
}
"""verl section -> {verl key under it: the ROLL key of this stack}. An empty mapping: no
counterpart (rule rewards are the ``rewards`` section and ``custom_reward_function``). verl's
``reward_model`` and ``critic`` are ROLL keys too (rl_config.roll_compat, the schema): they are
judged as such."""


def verl_section_hint(key: str) -> str:
    """The hint for an unknown top-level ``key`` that is a verl section ('' otherwise)."""
    if key not in VERL_SECTIONS:
        return ""
    pairs = VERL_SECTIONS[key]
    head = f"'{key}' is a verl section; this stack reads ROLL's key names"
    if not pairs:
        return f"{head}; rule rewards are the rewards section and custom_reward_function"
    return head + ": " + ", ".join(f"{key}.{v} -> {r}" for v, r in pairs.items())
