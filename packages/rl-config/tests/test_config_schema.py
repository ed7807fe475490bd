"""Schema strictness, messages and cross-field rules."""

from __future__ import annotations

from typing import Any

import pytest

from rl_config import ConfigError, ExperimentConfig, explain

MIN: dict[str, Any] = {"pretrain": "m"}


def validate(**extra: Any) -> ExperimentConfig:
    return ExperimentConfig.model_validate({**MIN, **extra})


def issues_of(**extra: Any) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        validate(**extra)
    return {i.path: i.message for i in info.value.issues}


def agentic(**extra: Any) -> dict[str, Any]:
    envs = {"Sok": {"env_type": "sokoban"}, "Lake": {"env_type": "frozen_lake"}}
    manager = {"num_env_groups": 4, "group_size": 2, "tags": ["Sok", "Lake"]}
    return {"custom_envs": envs, "train_env_manager": manager, "rollout_batch_size": 8, **extra}


def test_config_minimal_yaml_is_valid_on_cpu() -> None:
    cfg = validate()
    assert cfg.actor_train.strategy_args is not None
    assert cfg.actor_train.strategy_args.strategy_name == "fsdp2_train"
    assert cfg.actor_infer.strategy_args is not None
    assert cfg.actor_infer.strategy_args.strategy_name == "hf_infer"
    assert cfg.actor_train.device_mapping is None and cfg.actor_train.world_size == 1
    assert cfg.actor_train.model_args.dtype == "fp32"
    assert cfg.reference.model_args.model_name_or_path == "m"
    assert cfg.critic is None and not cfg.is_agentic and not cfg.is_async
    assert cfg.sequence_length == 1024
    assert cfg.policy_loss == "ppo_clip" and cfg.kl_controller == "fixed"
    assert not cfg.enable_reference


def test_config_empty_config_names_pretrain() -> None:
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.model_validate({})
    assert [i.path for i in info.value.issues] == ["pretrain"]


def test_config_all_field_errors_reported_together() -> None:
    found = issues_of(
        seed="abc",
        actor_train={"training_args": {"learning_rat": 1e-5, "per_device_train_batch_size": 0}},
        kl_penalty="kll",
        resume_from_checkpoint=3,
        learning_rate=1e-5,
    )
    assert found["seed"] == "expected an integer, got 'abc' (str)"
    assert found["actor_train.training_args.learning_rat"] == (
        "unknown key; did you mean 'learning_rate'?"
    )
    assert (
        "greater than or equal to 1"
        in found["actor_train.training_args.per_device_train_batch_size"]
    )
    assert "did you mean 'kl'?" in found["kl_penalty"]
    assert found["resume_from_checkpoint"] == "expected true or false or a string, got 3 (int)"
    assert "actor_train.training_args.learning_rate" in found["learning_rate"]


def test_config_an_infinite_float_is_refused_by_name() -> None:
    """`beta=inf` validated (beta > 0) and every DPO loss and reward became NaN."""
    inf = float("inf")
    found = issues_of(
        beta=inf, init_kl_coef=-inf, actor_train={"training_args": {"learning_rate": inf}}
    )
    for key in ("beta", "init_kl_coef", "actor_train.training_args.learning_rate"):
        assert found[key].startswith("must be a finite number"), key


def test_config_a_bool_is_refused_where_a_number_is_expected() -> None:
    """Pydantic's lax mode read `max_steps: true` as 1 and `beta: false` as 0.0; every int and
    float key (nested, in a list or a mapping) now refuses a bool by name, one rule for all."""
    found = issues_of(
        max_steps=True,
        beta=False,
        actor_train={
            "training_args": {"learning_rate": True, "per_device_train_batch_size": True},
            "data_args": {"domain_interleave_probs": {"math": True}},
        },
        custom_envs={"FL": {"env_type": "frozen_lake", "max_steps": True}},
    )
    assert found["max_steps"] == "expected an integer, not a bool (got True (bool))"
    assert found["beta"] == "expected a number, not a bool (got False (bool))"
    assert (
        found["actor_train.training_args.learning_rate"]
        == "expected a number, not a bool (got True (bool))"
    )
    assert found["actor_train.training_args.per_device_train_batch_size"].endswith("True (bool))")
    assert found["actor_train.data_args.domain_interleave_probs"].endswith(
        "not a bool (got {'math': True} (dict))"
    )
    assert found["custom_envs.FL.max_steps"].endswith("True (bool))")


def test_config_a_bool_key_still_takes_a_bool() -> None:
    cfg = validate(use_kl_loss=True, max_steps=7)
    assert cfg.use_kl_loss is True and cfg.max_steps == 7


def test_config_unknown_key_inside_dict_of_models() -> None:
    found = issues_of(**agentic(custom_envs={"Sok": {"env_type": "sokoban", "max_step": 3}}))
    assert found["custom_envs.Sok.max_step"] == "unknown key; did you mean 'max_steps'?"


@pytest.mark.parametrize(
    ("role", "name", "fragment"),
    [
        ("actor_train", "megatron_train", "Megatron-LM is not implemented"),
        ("critic", "megatron_train", "Megatron-LM is not implemented"),
        ("actor_infer", "sglang", "not supported; use vllm, hf_infer or replay"),
        ("actor_infer", "deepspeed_train", "cannot be used for actor_infer"),
        ("actor_train", "vllm", "cannot be used for actor_train"),
        ("reference", "megatron_infer", "rl-config convert FILE --strategy fsdp2|deepspeed"),
        ("actor_train", "deepspeed_trian", "did you mean 'deepspeed_train'?"),
    ],
)
def test_config_strategy_support(role: str, name: str, fragment: str) -> None:
    spec: dict[str, Any] = {"adv_estimator": "gae", "critic": {}}
    spec[role] = {"strategy_args": {"strategy_name": name}}
    found = issues_of(**spec)
    assert fragment in found[f"{role}.strategy_args.strategy_name"]


def test_config_devices_checked_against_cluster() -> None:
    found = issues_of(
        num_nodes=1,
        num_gpus_per_node=4,
        actor_train={"device_mapping": "list(range(2,6))"},
        actor_infer={"device_mapping": [0, 0]},
    )
    assert "[4, 5] are outside the 4 declared devices" in found["actor_train.device_mapping"]
    assert "more than once" in found["actor_infer.device_mapping"]
    cfg = validate(
        num_nodes=2, num_gpus_per_node=4, actor_train={"device_mapping": "list(range(2,6))"}
    )
    assert cfg.actor_train.world_size == 4


def test_config_node_resources_one_distinct_name_per_node() -> None:
    assert (
        "1 name(s) for num_nodes=2"
        in issues_of(num_nodes=2, node_resources=["a"])["node_resources"]
    )
    assert (
        "['a'] appear more than once"
        in issues_of(num_nodes=2, node_resources=["a", "a"])["node_resources"]
    )
    assert (
        "entries [1] are empty"
        in issues_of(num_nodes=2, node_resources=["a", " "])["node_resources"]
    )
    cfg = validate(num_nodes=2, node_resources=["trainer_node", "rollout_node"])
    assert cfg.node_resources == ["trainer_node", "rollout_node"]


def test_config_unset_num_nodes_is_derived_from_device_ids_as_roll_does() -> None:
    cfg = validate(
        num_gpus_per_node=4,
        rollout_batch_size=12,
        actor_train={"device_mapping": "list(range(0,12))"},
    )
    assert cfg.num_nodes == 3
    (note,) = [w for w in cfg.config_warnings() if w.startswith("num_nodes:")]
    assert "derived as 3 from device id 11 and num_gpus_per_node 4" in note


def test_config_unset_gpus_per_node_with_device_ids_is_rolls_8() -> None:
    """ROLL's examples list devices 0..7 and leave num_gpus_per_node to ROLL (8, the machine's
    device count there); read as 1 here, they spanned 8 one-device nodes and a TP-2 engine's
    devices 'span nodes'. Unset with device ids: 8, with a warning; without ids (CPU): 1."""
    cfg = validate(actor_train={"device_mapping": "list(range(0,8))"})
    assert (cfg.num_gpus_per_node, cfg.num_nodes, cfg.total_devices) == (8, 1, 8)
    (note,) = [w for w in cfg.config_warnings() if w.startswith("num_gpus_per_node:")]
    assert "not set; taken as 8, ROLL's default" in note
    two = validate(actor_train={"device_mapping": "list(range(0,16))"}, rollout_batch_size=16)
    assert (two.num_gpus_per_node, two.num_nodes) == (8, 2)
    cpu = validate()
    assert (cpu.num_gpus_per_node, cpu.num_nodes) == (1, 1)
    assert not [w for w in cpu.config_warnings() if w.startswith("num_gpus_per_node")]
    mine = validate(num_gpus_per_node=1, actor_train={"device_mapping": [0]})
    assert mine.num_gpus_per_node == 1
    assert not [w for w in mine.config_warnings() if w.startswith("num_gpus_per_node")]


def test_config_vllm_devices_per_worker_follow_tensor_parallel() -> None:
    cfg = validate(
        num_gpus_per_node=8,
        actor_infer={
            "device_mapping": "list(range(0,4))",
            "strategy_args": {
                "strategy_name": "vllm",
                "strategy_config": {"tensor_parallel_size": 2},
            },
        },
    )
    assert cfg.actor_infer.num_gpus_per_worker == 2 and cfg.actor_infer.world_size == 2
    found = issues_of(
        num_gpus_per_node=8,
        actor_infer={
            "device_mapping": [0, 1, 2],
            "strategy_args": {
                "strategy_name": "vllm",
                "strategy_config": {"tensor_parallel_size": 2},
            },
        },
    )
    assert "not divisible by num_gpus_per_worker=2" in found["actor_infer.device_mapping"]
    found = issues_of(actor_train={"num_gpus_per_worker": 2})
    assert "one device each" in found["actor_train.num_gpus_per_worker"]


def test_config_batch_arithmetic() -> None:
    # RLVR: 6 prompts x 2 samples = 12 samples; 2 ranks x micro 4 = 8 per round -> not divisible
    found = issues_of(
        num_gpus_per_node=2,
        rollout_batch_size=6,
        num_return_sequences_in_group=2,
        actor_train={"device_mapping": [0, 1], "training_args": {"per_device_train_batch_size": 4}},
    )
    message = found["actor_train.training_args.per_device_train_batch_size"]
    assert "12 samples per step" in message and "multiple of 8" in message
    ok = validate(
        num_gpus_per_node=2,
        rollout_batch_size=8,
        num_return_sequences_in_group=2,
        actor_train={"device_mapping": [0, 1], "training_args": {"per_device_train_batch_size": 4}},
    )
    assert ok.samples_per_step == 16


def test_config_sequence_lengths() -> None:
    found = issues_of(prompt_length=512, response_length=600, sequence_length=1024)
    assert "512 + response_length 600 = 1112" in found["sequence_length"]
    cfg = validate(prompt_length=512, response_length=256)
    assert cfg.sequence_length == 768
    found = issues_of(response_length=100, actor_infer={"generating_args": {"max_new_tokens": 200}})
    assert "above response_length 100" in found["actor_infer.generating_args.max_new_tokens"]
    # RLVR: response_length is the generation budget; a smaller written max_new_tokens is refused
    found = issues_of(response_length=100, actor_infer={"generating_args": {"max_new_tokens": 50}})
    message = found["actor_infer.generating_args.max_new_tokens"]
    assert "is 50, below response_length 100" in message and "${response_length}" in message
    validate(response_length=200)  # max_new_tokens left at its default (128): response_length
    validate(response_length=100, actor_infer={"generating_args": {"max_new_tokens": 100}})
    small = {"generating_args": {"max_new_tokens": 50}}
    validate(**agentic(response_length=100, actor_infer=small))  # agentic: per-turn budget
    found = issues_of(
        actor_train={
            "use_dynamic_batching_in_train": True,
            "max_tokens_per_microbatch_in_train": 10,
        }
    )
    assert "at least 1024" in found["actor_train.max_tokens_per_microbatch_in_train"]


def test_config_dpo_is_not_refused_for_the_generation_defaults_it_ignores() -> None:
    """A DPO run never generates (actor_infer is ignored, rl_config.contract.DPO_IGNORED): the
    default max_new_tokens 128 used to refuse any DPO sequence_length <= 128, and num_beams, a
    key DPO ignores, was an error instead of the ignored-key warning."""
    dpo = validate(beta=0.2, sequence_length=100)
    assert dpo.pipeline_kind == "dpo"
    beams = validate(beta=0.2, actor_infer={"generating_args": {"num_beams": 2}})
    assert any(
        w.startswith("actor_infer.generating_args.num_beams") for w in beams.config_warnings()
    )
    found = issues_of(sequence_length=100)  # RLVR generates: still refused
    assert "no room for the prompt" in found["actor_infer.generating_args.max_new_tokens"]


def test_config_preference_columns_must_differ() -> None:
    """`chosen_key=rejected` (rejected_key's default) passed validation; the run failed at data
    load, or trained on pairs of identical responses. Refused by name, both keys in the message."""
    found = issues_of(beta=0.1, chosen_key="rejected")
    assert found["rejected_key"].startswith("is 'rejected', the same column as chosen_key=")
    found = issues_of(loss_type="kto", label_key="completion")
    assert "the same column as completion_key" in found["label_key"]
    assert validate(beta=0.1, chosen_key="better", rejected_key="worse").chosen_key == "better"


def test_config_agentic_rules() -> None:
    cfg = validate(**agentic())
    assert cfg.is_agentic and cfg.train_env_manager is not None
    assert cfg.train_env_manager.groups_per_tag() == {"Sok": 2, "Lake": 2}
    found = issues_of(
        **agentic(
            train_env_manager={
                "num_env_groups": 4,
                "group_size": 3,
                "tags": ["Sok", "Lak"],
                "num_groups_partition": [1, 2],
            },
            val_env_manager={"tags": ["Sok"], "max_traj_per_env": 0},
        )
    )
    assert "did you mean 'Lake'?" in found["train_env_manager.tags[1]"]
    assert "sums to 3 but num_env_groups is 4" in found["train_env_manager.num_groups_partition"]
    assert "not a multiple of train_env_manager.group_size 3" in found["rollout_batch_size"]
    found = issues_of(
        **agentic(
            train_env_manager={
                "tags": ["Sok"],
                "max_traj_per_env": 1,
                "num_env_groups": 2,
                "group_size": 2,
            }
        )
    )
    assert "only 4 trajectories" in found["train_env_manager.max_traj_per_env"]
    found = issues_of(
        **agentic(
            custom_envs={
                "Sok": {"env_type": "s", "agent_template": "{observation} {oops}"},
                "Lake": {"env_type": "f"},
            }
        )
    )
    assert "{oops}" in found["custom_envs.Sok.agent_template"]
    found = issues_of(**agentic(actor_infer={"generating_args": {"num_return_sequences": 4}}))
    assert "group_size" in found["actor_infer.generating_args.num_return_sequences"]


def test_config_algorithm_rules() -> None:
    assert "add a `critic:`" in issues_of(adv_estimator="gae")["adv_estimator"]
    cfg = validate(adv_estimator="gae", critic={}, reward_pretrain="r")
    assert cfg.critic is not None and cfg.critic.model_args.model_name_or_path == "r"
    assert "target_kl" in issues_of(adaptive_kl_ctrl=True)
    assert validate(target_kl=0.1, init_kl_coef=0.2).kl_controller == "adaptive"
    assert validate(use_kl_loss=True, kl_loss_coef=0.01).enable_reference
    assert "num_beams" in str(issues_of(actor_infer={"generating_args": {"num_beams": 2}}))
    assert validate(actor_train={"pg_variant": "ppo"}).policy_loss == "ppo_clip"


@pytest.mark.parametrize("key", ["kl_penalty", "kl_loss_type"])
def test_config_full_vocabulary_kl_is_refused_by_name(key: str) -> None:
    """'full' needs the reference's [B, T, V] logits in the train step, which no worker passes:
    it used to validate and then raise inside the first train step (kl_penalty(kind='full'))."""
    found = issues_of(**{key: "full", "use_kl_loss": True, "kl_loss_coef": 0.1})
    assert found[key].startswith("is 'full' (the exact KL over the vocabulary)")
    for kind in ("k1", "k2", "k3", "abs", "kl", "mse", "low_var_kl"):
        validate(**{key: kind})


@pytest.mark.parametrize("estimator", ["dr_grpo", "rloo", "reinforce_pp", "remax", "opo", "gpg"])
def test_config_std_free_estimators_refuse_a_std_scaling_reward_normalization(estimator) -> None:
    """These estimators bring their own baseline and no group std: z-scored rewards before them
    change the algorithm (dr_grpo on z-scores is grpo), whether the method is written or not."""
    default = issues_of(adv_estimator=estimator)["reward_normalization.method"]
    assert (
        default.startswith("is 'mean_std' (the default), which divides") and "identity" in default
    )
    written = issues_of(adv_estimator=estimator, reward_normalization={"method": "asym_clip"})
    assert written["reward_normalization.method"].startswith("is 'asym_clip', which divides")
    for method in ("identity", "mean"):
        validate(adv_estimator=estimator, reward_normalization={"method": method})
    for estimator_ok in ("grpo", "reinforce", "grpo_passk"):  # std-normalised by definition
        validate(adv_estimator=estimator_ok)


def test_config_lr_schedule_keys_are_read_by_the_schedule() -> None:
    def train(role: str = "actor_train", **args: Any) -> dict[str, Any]:
        return {role: {"training_args": args}}

    found = issues_of(**train(warmup_steps=5, lr_scheduler_type="constant"))
    assert "constant_with_warmup" in found["actor_train.training_args.warmup_steps"]
    # under the default (constant) schedule, as ROLL examples write warmup_steps: a warning
    warnings = validate(**train(warmup_steps=5)).config_warnings()
    (warning,) = [w for w in warnings if "warmup" in w]
    assert warning.startswith("actor_train.training_args.warmup_steps: is 5 but")
    assert "constant is the default lr_scheduler_type" in warning
    found = issues_of(**train(warmup_ratio=0.1, lr_scheduler_type="constant"))
    assert "has no warmup" in found["actor_train.training_args.warmup_ratio"]
    found = issues_of(
        **train(lr_scheduler_type="constant_with_warmup", lr_scheduler_kwargs={"min_lr_rate": 0.1})
    )
    message = found["actor_train.training_args.lr_scheduler_kwargs.min_lr_rate"]
    assert "constant_with_warmup does not decay" in message and "cosine_with_min_lr" in message
    found = issues_of(**train(lr_scheduler_kwargs={"min_lr": 1e-7}))
    assert "actor_train.training_args.lr_scheduler_kwargs.min_lr" in found
    critic = {"training_args": {"warmup_steps": 2, "lr_scheduler_type": "constant"}}
    found = issues_of(critic=critic, adv_estimator="gae", reward_pretrain="r")
    assert "critic.training_args.warmup_steps" in found
    # defaults (0) pass; the schedules that read the keys accept them
    validate(**train(warmup_steps=0, warmup_ratio=0.0, lr_scheduler_kwargs={"min_lr_rate": 0}))
    validate(**train(warmup_steps=5, lr_scheduler_type="constant_with_warmup"))
    for name in ("linear", "cosine", "cosine_with_min_lr"):
        kwargs = {"min_lr_rate": 0.1}
        validate(**train(warmup_ratio=0.1, lr_scheduler_type=name, lr_scheduler_kwargs=kwargs))


def test_config_async_rules() -> None:
    cfg = validate(async_generation_ratio=1.5)
    assert cfg.async_.max_staleness == 2 and cfg.is_async
    assert cfg.async_.queue_size == 2 * cfg.samples_per_step
    found = issues_of(async_generation_ratio=2, **{"async": {"max_staleness": 1}})
    assert "set max_staleness >= 2" in found["async.max_staleness"]
    found = issues_of(
        num_gpus_per_node=2,
        actor_train={"device_mapping": [0, 1]},
        actor_infer={"device_mapping": [1]},
        **{"async": {"max_staleness": 1}},
    )
    assert "shares devices [1] with actor_train" in found["actor_infer.device_mapping"]
    found = issues_of(
        num_gpus_per_node=2,
        actor_train={"device_mapping": [0]},
        actor_infer={"device_mapping": [1]},
        reference={"device_mapping": [1]},
        **{"async": {"max_staleness": 1}},
    )
    assert "shares devices [1] with reference" in found["actor_infer.device_mapping"]
    assert "async.partial_rollout" in issues_of(**{"async": {"partial_rollout": True}})


def test_config_warnings() -> None:
    cfg = validate(
        rollout_batch_size=4,
        num_return_sequences_in_group=1,
        actor_train={"training_args": {"gradient_accumulation_steps": 8}},
        kl_loss_coef=0.1,
    )
    text = "\n".join(cfg.config_warnings())
    assert "optimizer steps less than once" in text
    assert "zero advantages" in text
    assert "use_kl_loss is false" in text
    assert validate(rollout_batch_size=8, num_return_sequences_in_group=4).config_warnings() == []


def test_config_warns_about_loss_keys_their_switch_turns_off() -> None:
    def warnings(**extra: Any) -> list[str]:
        return [w for w in validate(**extra).config_warnings() if "has no effect" in w]

    (low, high) = warnings(pg_clip_low=0.1, pg_clip_high=0.28)
    assert low == "pg_clip_low=0.1 has no effect: use_pg_clip_range is false"
    assert high.startswith("pg_clip_high=0.28 has no effect: use_pg_clip_range is false")
    (clip,) = warnings(use_pg_clip_range=True, pg_clip=0.3, pg_clip_high=0.28)
    assert clip.startswith("pg_clip=0.3 has no effect: use_pg_clip_range is true")
    assert warnings(dual_clip_c=5.0) == ["dual_clip_c=5.0 has no effect: dual_clip_loss is false"]
    # read by the switch they belong to, or at their defaults: no warning
    assert warnings(use_pg_clip_range=True, pg_clip_low=0.1, pg_clip_high=0.28) == []
    assert warnings(pg_clip=0.3, dual_clip_loss=True, dual_clip_c=5.0) == []
    assert warnings(pg_clip_low=0.2, pg_clip_high=0.2, dual_clip_c=3.0) == []
    assert warnings(use_pg_clip_range=True, pg_clip=0.2) == []
    assert warnings(difficulty_low_threshold=0.1) == [
        "difficulty_low_threshold=0.1 has no effect: difficulty_mask is false"
    ]
    assert warnings(difficulty_mask=True, difficulty_low_threshold=0.1) == []


def test_difficulty_thresholds_that_leave_no_group_are_refused_by_name() -> None:
    with pytest.raises(ConfigError) as info:
        validate(difficulty_mask=True, difficulty_low_threshold=0.9, difficulty_high_threshold=0.5)
    (issue,) = info.value.issues
    assert issue.path == "difficulty_low_threshold" and "below difficulty_high_threshold" in (
        issue.message
    )
    validate(difficulty_low_threshold=0.9, difficulty_high_threshold=0.5)  # off: only warned


def test_config_dpo_warns_about_rlvr_validation_and_reward_keys() -> None:
    cfg = validate(
        beta=0.2,  # a preference key: a DPO config
        val_greedy=True,
        val_n_sample=4,
        custom_reward_function={"path": "r.py"},
        rewards={"math": {"tag_included": ["gsm8k"]}},
    )
    assert cfg.pipeline_kind == "dpo"
    ignored = [w.split("=")[0] for w in cfg.config_warnings() if "has no effect" in w]
    assert ignored == [
        "val_n_sample",
        "val_greedy",
        "rewards.math.tag_included",
        "custom_reward_function.path",
    ]
    assert not [w for w in validate(beta=0.2).config_warnings() if "has no effect" in w]


@pytest.mark.parametrize("value", [True, "false", 1])
@pytest.mark.parametrize("role", ["actor_infer", "reference", "actor_train"])
def test_config_strategy_config_cannot_turn_remote_code_on(role: str, value: Any) -> None:
    name = {"actor_infer": "hf_infer", "reference": "hf_infer", "actor_train": "deepspeed_train"}
    strategy = {"strategy_name": name[role], "strategy_config": {"trust_remote_code": value}}
    found = issues_of(**{role: {"strategy_args": strategy}})
    message = found[f"{role}.strategy_args.strategy_config.trust_remote_code"]
    assert message.startswith(f"{value!r} is not supported: remote model code is never run")
    strategy["strategy_config"] = {"trust_remote_code": False}
    validate(**{role: {"strategy_args": strategy}})


def test_config_warns_about_deepspeed_values_the_backend_replaces() -> None:
    def warnings(strategy_config: dict[str, Any], **extra: Any) -> list[str]:
        strategy = {"strategy_name": "deepspeed_train", "strategy_config": strategy_config}
        cfg = validate(
            rollout_batch_size=8,
            num_return_sequences_in_group=4,
            actor_train={"strategy_args": strategy, **extra},
        )
        prefix = "actor_train.strategy_args.strategy_config."
        return [w.removeprefix(prefix) for w in cfg.config_warnings() if w.startswith(prefix)]

    explicit = {
        "bf16": {"enabled": True},
        "fp16": {"enabled": False},  # agrees with the fp32 default dtype
        "gradient_clipping": 0.5,
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4,
        "optimizer": {"type": "AdamW"},
        "scheduler": {"type": "WarmupLR"},
    }
    found = warnings(explicit)
    assert [w.split(":")[0] for w in found] == [
        "bf16.enabled",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "train_batch_size",
        "gradient_clipping",
        "optimizer",
        "scheduler",
    ]
    assert found[0] == (
        "bf16.enabled: True is replaced by False (set by actor_train.model_args.dtype); remove "
        "it or write auto"
    )
    assert "0.5 is replaced by 1.0 (set by max_grad_norm)" in found[4]
    assert "is dropped (set by actor_train.training_args.learning_rate" in found[5]
    # auto, and explicit values equal to what the backend sets, pass
    auto = {k: "auto" for k in explicit} | {"bf16": {"enabled": "auto"}}
    assert warnings(auto) == []
    agreeing = {
        "bf16": {"enabled": True},
        "fp16": {"enabled": False},
        "gradient_clipping": 1.0,
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4,
    }
    args = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4}
    assert warnings(agreeing, model_args={"dtype": "bf16"}, training_args=args) == []


def test_config_dump_round_trip(seed_yaml) -> None:
    from rl_config import load_config

    cfg = load_config(seed_yaml)
    again = ExperimentConfig.model_validate(cfg.to_dict())
    assert again == cfg
    assert "async" in cfg.to_dict() and "async_" not in cfg.to_dict()


def test_config_explain() -> None:
    doc = explain("actor_train.training_args.learning_rate")
    assert doc.type == "float" and doc.default == pytest.approx(1e-6) and "> 0" in doc.constraints
    assert "learning rate" in doc.description.lower()
    assert explain("async.max_staleness").description.startswith("Weight versions")
    assert explain("custom_envs.AnyName.env_type").path == "custom_envs.AnyName.env_type"
    assert any(c.startswith("learning_rate") for c in explain("actor_train.training_args").children)
    with pytest.raises(ConfigError, match="did you mean 'learning_rate'"):
        explain("actor_train.training_args.learning_rat")


def test_config_every_field_is_documented() -> None:
    from rl_config.schema_walk import is_model, unwrap

    seen: set[type] = set()
    missing: list[str] = []

    def visit(model: type) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, info in model.model_fields.items():  # type: ignore[attr-defined]
            if not info.description:
                missing.append(f"{model.__name__}.{name}")
            inner = unwrap(info.annotation)
            for candidate in (inner, *getattr(inner, "__args__", ())):
                candidate = unwrap(candidate)
                if is_model(candidate):
                    visit(candidate)

    visit(ExperimentConfig)
    assert missing == []


@pytest.mark.parametrize("threads", ["0", "two", "-1", "1.5", ""])
def test_config_system_envs_thread_count_must_be_a_whole_number(threads: str) -> None:
    issues = issues_of(system_envs={"OMP_NUM_THREADS": threads})
    assert list(issues) == ["system_envs"]
    assert "OMP_NUM_THREADS" in issues["system_envs"] and repr(threads) in issues["system_envs"]


def test_config_system_envs_thread_count_accepts_yaml_integers() -> None:
    assert validate(system_envs={"OMP_NUM_THREADS": 4}).system_envs == {"OMP_NUM_THREADS": "4"}
