"""rl_runtime.resume_guard: which config changes a resume refuses, warns about, or passes."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest

from rl_config.contract import schema_keys
from rl_config.errors import ConfigError
from rl_config.schema import ExperimentConfig
from rl_runtime.resume_guard import (
    RESUME_NOTED,
    RESUME_REFUSED,
    RESUME_SILENT,
    changed_keys,
    check_resume,
    config_record,
)

BASE = {
    "pretrain": "m",
    "rollout_batch_size": 4,
    "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["FL"]},
    "custom_envs": {"FL": {"env_type": "frozen_lake"}},
}


def _cfg(**changes: object) -> ExperimentConfig:
    data = {**BASE, **changes}
    return ExperimentConfig.model_validate(data)


def test_changed_keys_descends_mappings_and_names_a_new_section_once():
    old = {"a": {"b": 1, "c": [1, 2]}, "s": None}
    new = {"a": {"b": 2, "c": [1, 2], "d": 0}, "s": {"x": 1, "y": 2}}
    assert list(changed_keys(old, new)) == [
        ("a.b", 1, 2),
        ("a.d", None, 0),
        ("s", None, {"x": 1, "y": 2}),
    ]


def test_unchanged_config_passes_silently():
    saved = config_record(_cfg(resume_from_checkpoint=False))
    assert check_resume(saved, _cfg(resume_from_checkpoint=True), "ck/step-000003") == []


def test_harmless_changes_are_warnings_naming_key_and_values():
    saved = config_record(_cfg(max_steps=3))
    warnings = check_resume(saved, _cfg(max_steps=8, logging_steps=5), "ck/step-000003")
    assert len(warnings) == 2
    assert warnings[0].startswith("max_steps changed since checkpoint ck/step-000003: 3 -> 8")
    assert warnings[1].startswith("logging_steps changed")


def test_a_key_that_applies_in_part_says_so():
    saved = config_record(_cfg(init_kl_coef=0.1, target_kl=0.5))
    (line,) = check_resume(saved, _cfg(init_kl_coef=0.2, target_kl=0.5), "ck")
    assert line.startswith("init_kl_coef changed since checkpoint ck: 0.1 -> 0.2")
    assert "adaptive KL control" in line and "checkpointed coefficient" in line


def test_breaking_changes_are_one_error_naming_each_key():
    saved = config_record(_cfg())
    new = _cfg(
        seed=7,
        adv_estimator="reinforce",
        rollout_batch_size=8,
        train_env_manager={"num_env_groups": 2, "group_size": 4, "tags": ["FL"]},
        max_steps=9,  # harmless: not in the error
    )
    with pytest.raises(ConfigError) as info:
        check_resume(saved, new, "ck/step-000003")
    paths = [i.path for i in info.value.issues]
    assert paths == [
        "seed",
        "rollout_batch_size",
        "adv_estimator",
        "train_env_manager.group_size",
    ]
    seed = info.value.issues[0].message
    assert seed.startswith("42 in checkpoint ck/step-000003, now 7: the env and sampling seeds")
    assert "resume_from_checkpoint: false" in seed


def test_model_strategy_and_a_new_critic_are_refused():
    saved = config_record(_cfg())
    critic = {
        "device_mapping": [0],
        "strategy_args": {"strategy_name": "fsdp2_train", "strategy_config": {}},
    }
    new = _cfg(
        pretrain="other",
        actor_train={"strategy_args": {"strategy_name": "deepspeed_train"}},
        critic=critic,
    )
    with pytest.raises(ConfigError) as info:
        check_resume(saved, new, "ck")
    paths = {i.path for i in info.value.issues}
    assert {"pretrain", "actor_train.strategy_args.strategy_name", "critic"} <= paths
    assert "{...}" in next(i.message for i in info.value.issues if i.path == "critic")


def test_a_checkpoint_without_a_config_is_one_warning():
    (line,) = check_resume(None, _cfg(), "ck/step-000001")
    assert "records no config" in line


def test_every_pattern_names_schema_keys():
    keys = schema_keys()
    for pattern in (*RESUME_REFUSED, *RESUME_SILENT, *RESUME_NOTED):
        assert any(fnmatchcase(k, pattern) or k.startswith(pattern + ".") for k in keys), pattern
