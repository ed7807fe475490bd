"""verl keys on the command line and verl config files: one error per verl key naming the ROLL key
that holds its setting (or saying there is none); a verl file is refused as a whole."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rl_config import ConfigError, load_config
from rl_config.contract import schema_keys
from rl_config.explain import explain
from rl_config.roll_compat import ROLL_IGNORED, ROLL_NOT_SUPPORTED
from rl_config.schema.worker import FSDP2_OPTIONS, WorkerConfig
from rl_config.schema_walk import yaml_fields
from rl_config.verl_keys import ROLL_SECTIONS, VERL_SECTIONS, counterpart

DATA = Path(__file__).parent / "data"
ENGINE = "actor_infer.strategy_args.strategy_config."
TRAIN_OPTIONS = tuple(f"{r}.strategy_args.strategy_config." for r in ("actor_train", "critic",
                                                                      "reference"))  # fmt: skip

# verl's GSM8K GRPO run (verl's GSM8K quickstart): python3 -m verl.trainer.main_ppo ...
_GSM8K_RUN = """algorithm.adv_estimator=grpo data.train_files=/data/gsm8k/train.parquet
data.val_files=/data/gsm8k/test.parquet data.train_batch_size=128 data.max_prompt_length=512
data.max_response_length=128 data.filter_overlong_prompts=True data.truncation=error
actor_rollout_ref.model.path=/models/Qwen2.5-0.5B-Instruct actor_rollout_ref.actor.optim.lr=5e-7
actor_rollout_ref.model.use_remove_padding=False actor_rollout_ref.actor.entropy_coeff=0.001
actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=20
actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.model.enable_gradient_checkpointing=True
actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40 actor_rollout_ref.rollout.enable_chunked_prefill=False
actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40 actor_rollout_ref.ref.fsdp_config.param_offload=True
algorithm.kl_ctrl.kl_coef=0.001 trainer.critic_warmup=0 trainer.logger=console
trainer.project_name=verl_grpo_example_gsm8k trainer.experiment_name=qwen2_7b_function_rm
trainer.n_gpus_per_node=2 trainer.nnodes=1 trainer.save_freq=-1 trainer.test_freq=5
trainer.total_epochs=1 trainer.device=npu"""  # fmt: skip
GSM8K = [str(o) for o in _GSM8K_RUN.split()]


def _refusals(write_yaml, overrides: list[str]) -> dict[str, str]:
    path = write_yaml("exp.yaml", "pretrain: m\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return {i.path: i.message for i in info.value.issues}


def test_every_roll_key_a_verl_hint_names_is_a_schema_key():
    """Each counterpart is a schema key, or a backend option under strategy_config (FSDP2's
    table for training roles; vLLM's options are checked in tests/test_config_contract.py)."""
    keys = set(schema_keys())
    named = [k for pairs in VERL_SECTIONS.values() for found in pairs.values() for k in found.keys]
    assert len(named) > 80
    options = [k for k in named if k.startswith(TRAIN_OPTIONS)]
    assert options and [k for k in options if k.rpartition(".")[2] not in FSDP2_OPTIONS] == []
    other = [k for k in named if k not in options and not k.startswith(ENGINE)]
    assert [k for k in other if k not in keys] == []
    assert {p.rstrip(".") for p in (ENGINE, *TRAIN_OPTIONS)} <= keys


def test_verl_sections_do_not_shadow_roll_keys():
    """verl-only sections are neither schema nor ROLL keys; under the sections ROLL shares
    (critic, reward_model), no verl key listed starts with a ROLL worker field, so a ROLL key
    there is never answered with a verl counterpart."""
    top = {k.split(".")[0] for k in schema_keys()}
    roll = {k.split(".")[0] for k in {**ROLL_IGNORED, **ROLL_NOT_SUPPORTED}}
    verl_only = set(VERL_SECTIONS) - set(ROLL_SECTIONS)
    assert not verl_only & top and not verl_only & roll
    assert set(ROLL_SECTIONS) <= top | roll
    fields = set(yaml_fields(WorkerConfig))
    for section in ROLL_SECTIONS:
        assert not {k.split(".")[0] for k in VERL_SECTIONS[section]} & fields, section


def test_verl_gsm8k_overrides_get_one_error_per_key_naming_the_roll_key(write_yaml):
    """verl's GSM8K GRPO command line (verl's GSM8K quickstart): every override is an error at its own key,
    naming what to write instead or why there is nothing (no 'did you mean')."""
    by_path = _refusals(write_yaml, GSM8K)
    assert sorted(by_path) == sorted(o.split("=")[0] for o in GSM8K)
    assert all(m.startswith("verl key; ") for m in by_path.values())
    assert not any("did you mean" in m for m in by_path.values())
    expected = {
        "data.train_files": "use actor_train.data_args.file_name",
        "data.train_batch_size": "use rollout_batch_size",
        "actor_rollout_ref.rollout.n": "use num_return_sequences_in_group",
        "actor_rollout_ref.rollout.tensor_model_parallel_size":
            f"use {ENGINE}tensor_parallel_size",
        "actor_rollout_ref.rollout.gpu_memory_utilization": f"use {ENGINE}gpu_memory_utilization",
        "actor_rollout_ref.model.enable_gradient_checkpointing":
            "use actor_train.model_args.disable_gradient_checkpointing (inverted",
        "actor_rollout_ref.actor.ppo_mini_batch_size":
            "use actor_train.training_args.gradient_accumulation_steps",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu":
            "use actor_train.training_args.per_device_train_batch_size",
        "algorithm.kl_ctrl.kl_coef": "use init_kl_coef",
        "trainer.save_freq": "use save_steps",
        "trainer.total_epochs": "use max_steps (no epoch count",
        "trainer.project_name": "tracker_kwargs.project",
        "data.filter_overlong_prompts": "no counterpart: prompts longer than prompt_length are "
            "dropped (and counted) unless prompt_truncation cuts them",
        "trainer.device": "no counterpart: the device is detected",
    }  # fmt: skip
    assert {k: v for k, v in expected.items() if v not in by_path[k]} == {}


def test_other_verl_keys_users_pass(write_yaml):
    """Keys from verl's other documented runs (DAPO, async, one-step-off): their counterparts,
    Megatron blocks once per block, and an unlisted key said to have none listed."""
    overrides = [
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "algorithm.use_kl_in_reward=False",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
        "actor_rollout_ref.rollout.val_kwargs.n=1",
        "async_training.partial_rollout=True",
        "rollout.nnodes=1",
        "data.return_raw_input_ids=True",
    ]
    by_path = _refusals(write_yaml, overrides)
    assert by_path == {
        "actor_rollout_ref.rollout.temperature": "verl key; use "
        "actor_infer.generating_args.temperature",
        "actor_rollout_ref.actor.clip_ratio_high": "verl key; use pg_clip_high and "
        "use_pg_clip_range",
        "algorithm.use_kl_in_reward": "verl key; use add_token_level_kl",
        "actor_rollout_ref.actor.megatron": "verl key; no counterpart: Megatron-LM is not "
        "implemented (FSDP2 or DeepSpeed: strategy_args)",
        "actor_rollout_ref.rollout.val_kwargs.n": "verl key; use val_n_sample",
        "async_training.partial_rollout": "verl key; use async.partial_rollout",
        "rollout.nnodes": "verl key; use actor_infer.device_mapping (the rollout's device ids)",
        "data.return_raw_input_ids": "verl key; no counterpart listed (this stack reads ROLL's "
        "key names)",
    }


def test_verl_critic_keys_name_the_critic_keys_and_roll_critic_keys_pass(write_yaml):
    """critic is a section of both: verl's sub-keys get the critic.* keys to use, ROLL's
    (critic.model_args...) are judged by the schema as before (not flagged)."""
    by_path = _refusals(write_yaml, [
        "critic.optim.lr=1e-5", "critic.ppo_micro_batch_size_per_gpu=4", "critic.model.path=m",
        "critic.optim.foo=1", "critic.model_args.dtype=bf16",
    ])  # fmt: skip
    assert by_path == {
        "critic.optim.lr": "verl key; use critic.training_args.learning_rate",
        "critic.ppo_micro_batch_size_per_gpu": "verl key; use "
        "critic.training_args.per_device_train_batch_size",
        "critic.model.path": "verl key; use critic.model_args.model_name_or_path",
        "critic.optim.foo": "verl key; no counterpart listed (this stack reads ROLL's key names)",
    }


def test_verl_reward_model_keys_are_refused_with_their_counterparts(write_yaml):
    """verl's reward_model keys (verl's DAPO recipe) were ignored with a warning about ROLL's
    reward-model worker; now each is an error: the overlong buffer names overlong_penalty.*,
    enable/reward_manager say there are no reward models. ROLL's reward_model is judged as ROLL's."""
    by_path = _refusals(write_yaml, [
        "reward_model.enable=False", "reward_model.reward_manager=dapo",
        "reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
        "reward_model.reward_kwargs.overlong_buffer_cfg.len=4096",
        "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
    ])  # fmt: skip
    assert by_path["reward_model.reward_kwargs.overlong_buffer_cfg.len"] == (
        "verl key; use overlong_penalty.buffer_length"
    )
    assert (
        "use overlong_penalty.enable"
        in by_path["reward_model.reward_kwargs.overlong_buffer_cfg.enable"]
    )
    assert (
        "use overlong_penalty.penalty_factor"
        in by_path["reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor"]
    )
    assert (
        "a reward model is a rewards domain (reward_fn: reward_model)"
        in by_path["reward_model.enable"]
    )
    assert "overlong_penalty" in by_path["reward_model.reward_manager"]
    path = write_yaml("roll.yaml", "pretrain: m\nreward_model: {model_args: {dtype: bf16}}\n")
    with pytest.raises(ConfigError) as info:  # ROLL's reward_model: refused as ROLL's, by name
        load_config(path)
    assert "ROLL's reward-model worker section is not read" in str(info.value)


@pytest.mark.parametrize("with_defaults", [True, False])
def test_a_verl_config_file_is_refused_naming_the_file(tmp_path, with_defaults):
    """verl's ppo_trainer.yaml (Hydra defaults list, ${oc.select:...}) failed on its defaults
    ('Could not find algorithm/rollout_correction'); a composed verl dump (no defaults) got an
    error per verl key. Both are now one error naming the file and the ROLL keys per section."""
    path = tmp_path / "ppo_trainer.yaml"
    shutil.copy(DATA / "verl" / "ppo_trainer.yaml", path)
    if not with_defaults:
        text = path.read_text()
        start, end = text.index("defaults:"), text.index("actor_rollout_ref:")
        path.write_text(text[:start] + text[end:])
    with pytest.raises(ConfigError) as info:
        load_config(path, ["trainer.total_epochs=2"])
    (issue,) = info.value.issues
    assert issue.message.startswith(f"{path} is a verl config (")
    assert ("Hydra defaults list" in issue.message) is with_defaults
    lines = issue.message.splitlines()[1:]
    assert [line.split(":")[0] for line in lines] == ["actor_rollout_ref", "algorithm", "trainer"]
    assert "rollout.n -> num_return_sequences_in_group" in lines[0]
    assert "total_epochs -> max_steps" in lines[2]


def test_explain_names_the_counterpart_of_a_verl_key():
    with pytest.raises(ConfigError) as info:
        explain("critic.optim.lr")
    assert str(info.value.issues[0]) == (
        "critic.optim.lr: unknown key; verl key; use critic.training_args.learning_rate"
    )
    found = counterpart("actor_rollout_ref.actor.megatron.tensor_model_parallel_size")
    assert found is not None and found.keys == ()
