"""verl's sections on the command line: the error names the ROLL keys that hold the setting."""

from __future__ import annotations

import pytest

from rl_config import ConfigError, load_config
from rl_config.contract import schema_keys
from rl_config.roll_compat import ROLL_IGNORED, ROLL_NOT_SUPPORTED
from rl_config.verl_keys import VERL_SECTIONS


def test_every_roll_key_a_verl_hint_names_is_a_schema_key():
    keys = set(schema_keys())
    named = [roll for pairs in VERL_SECTIONS.values() for roll in pairs.values()]
    assert named and [k for k in named if k not in keys] == []
    assert not set(VERL_SECTIONS) & {k.split(".")[0] for k in keys}  # sections we do not have
    assert not set(VERL_SECTIONS) & {
        k.split(".")[0] for k in {**ROLL_IGNORED, **ROLL_NOT_SUPPORTED}
    }


def test_verl_overrides_are_refused_naming_the_roll_keys(write_yaml):
    """verl's GRPO example overrides (examples/grpo_trainer/run_qwen2-7b_math.sh), one per
    section: one issue per section, each naming what to write instead (not 'did you mean
    pretrain' for trainer)."""
    path = write_yaml("exp.yaml", "pretrain: m\n")
    overrides = ["algorithm.adv_estimator=grpo", "data.train_files=[a.parquet]",
                 "actor_rollout_ref.rollout.n=5", "trainer.save_freq=20"]  # fmt: skip
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    by_path = {i.path: i.message for i in info.value.issues}
    assert sorted(by_path) == ["actor_rollout_ref", "algorithm", "data", "trainer"]
    assert "data.train_files -> actor_train.data_args.file_name" in by_path["data"]
    assert (
        "actor_rollout_ref.rollout.n -> num_return_sequences_in_group"
        in by_path["actor_rollout_ref"]
    )
    assert "trainer.save_freq -> save_steps" in by_path["trainer"]
    assert "pretrain'" not in by_path["trainer"]
