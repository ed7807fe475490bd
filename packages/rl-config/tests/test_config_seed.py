"""ROLL's agentic Sokoban YAML loads unchanged from any directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_config import LIBRARY_DIR, ConfigError, ExperimentConfig, load_config, load_yaml_dict


def test_config_seed_yaml_loads_from_empty_dir(seed_yaml: Path) -> None:
    assert sorted(p.name for p in seed_yaml.parent.iterdir()) == ["agentic_val_sokoban.yaml"]
    cfg = load_config(seed_yaml)
    assert cfg.exp_name == "agentic_pipeline"
    assert cfg.actor_train.device_mapping == [0, 1]
    assert cfg.actor_infer.device_mapping == [2]
    assert cfg.reference.device_mapping == [3]
    assert cfg.actor_train.world_size == 2
    assert cfg.actor_train.training_args.learning_rate == pytest.approx(1e-6)
    assert cfg.actor_train.model_args.model_name_or_path == "Qwen/Qwen2.5-0.5B-Instruct"
    # ${deepspeed_zero3} came from the bundled library
    ds = cfg.actor_train.strategy_args
    assert ds is not None and ds.strategy_name == "deepspeed_train"
    assert ds.strategy_config is not None
    assert ds.strategy_config["zero_optimization"]["stage"] == 3
    # the file's own max_tokens_per_step (64) wins over the library's 128 inside custom_env.*
    assert set(cfg.custom_envs) == {
        "SimpleSokoban",
        "LargerSokoban",
        "SokobanDifferentGridVocab",
        "FrozenLake",
        "FrozenLakeThink",
    }
    assert cfg.custom_envs["SimpleSokoban"].max_tokens_per_step == 64
    assert cfg.custom_envs["FrozenLake"].env_type == "frozen_lake"
    assert cfg.custom_envs["FrozenLakeThink"].env_config["action_pattern"].startswith("<think>")
    assert cfg.train_env_manager is not None and cfg.train_env_manager.tags == ["SimpleSokoban"]
    assert cfg.val_env_manager is not None
    assert cfg.val_env_manager.groups_per_tag() == {
        "SimpleSokoban": 16,
        "LargerSokoban": 16,
        "SokobanDifferentGridVocab": 16,
        "FrozenLake": 16,
    }
    assert cfg.reward_normalization.grouping == "traj_group_id"
    assert cfg.is_agentic and cfg.samples_per_step == 16
    assert cfg.sequence_length == 1024


def test_config_seed_variables_dropped_and_hydra_ignored(seed_yaml: Path) -> None:
    data = load_yaml_dict(seed_yaml)
    assert "hydra" not in data and "defaults" not in data
    for variable in ("custom_env", "deepspeed_zero2", "max_actions_per_traj", "action_pattern"):
        assert variable not in data
    assert data["max_tokens_per_step"] == 64
    assert ExperimentConfig.model_validate(data) == load_config(seed_yaml)


def test_config_seed_learning_rate_typo_override(seed_yaml: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(seed_yaml, ["actor_train.training_args.learning_rat=1e-5"])
    text = str(info.value)
    assert "actor_train.training_args.learning_rat" in text
    assert "did you mean 'learning_rate'" in text
    assert str(seed_yaml) in text
    assert [i.path for i in info.value.issues] == ["actor_train.training_args.learning_rat"]


def test_config_seed_megatron_is_rejected_clearly(seed_yaml: Path) -> None:
    text = seed_yaml.read_text().replace(
        "strategy_name: deepspeed_train", "strategy_name: megatron_train"
    )
    seed_yaml.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(seed_yaml)
    (issue,) = info.value.issues
    assert issue.path == "actor_train.strategy_args.strategy_name"
    assert "Megatron-LM is not implemented" in issue.message
    assert "actor_train.strategy_args.strategy_name=megatron_train" in issue.message
    assert f"rl-config convert {seed_yaml} --strategy fsdp2|deepspeed -o OUT" in issue.message


def test_config_bundled_example_loads() -> None:
    cfg = load_config(LIBRARY_DIR / "examples" / "agentic_val_sokoban.yaml")
    assert cfg.custom_envs["SimpleSokoban"].max_tokens_per_step == 64


def test_config_overrides_reach_interpolations(seed_yaml: Path) -> None:
    cfg = load_config(
        seed_yaml,
        ["max_actions_per_traj=3", "actor_train.strategy_args.strategy_config=${deepspeed_zero2}"],
    )
    assert cfg.custom_envs["SimpleSokoban"].max_steps == 3
    assert cfg.custom_envs["SimpleSokoban"].env_config["max_steps"] == 3
    strategy = cfg.actor_train.strategy_args
    assert strategy is not None and strategy.strategy_config is not None
    assert strategy.strategy_config["zero_optimization"]["stage"] == 2
