"""ROLL compatibility: resolvers, device lists without eval, accepted keys named in warnings,
unknown keys still refused with a suggestion."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from rl_config import ConfigError, ExperimentConfig, load_config
from rl_config.roll_compat import MEGATRON_ONLY, ROLL_IGNORED, ROLL_NOT_SUPPORTED
from rl_config.roll_keys import matches, strip_roll_keys


def test_roll_resolvers_now_and_env(write_yaml, monkeypatch) -> None:
    monkeypatch.setenv("RL_TEST_DIR", "/data/runs")
    monkeypatch.delenv("RL_TEST_UNSET", raising=False)
    path = write_yaml(
        "r.yaml",
        "pretrain: m\n"
        "exp_name: run-${now:%Y}\n"
        "output_dir: ${oc.env:RL_TEST_DIR}/out\n"
        "logging_dir: ${oc.env:RL_TEST_UNSET,/tmp/fallback}\n"
        "tracker_kwargs:\n  api_key: ${oc.env:RL_TEST_UNSET}\n",
    )
    cfg = load_config(path)
    assert cfg.exp_name == f"run-{datetime.datetime.now().year}"
    assert cfg.output_dir == "/data/runs/out"
    assert cfg.logging_dir == "/tmp/fallback"
    assert cfg.tracker_kwargs["api_key"] is None
    assert (
        "tracker_kwargs.api_key: environment variable RL_TEST_UNSET is not set; the value is null"
        in cfg.config_warnings()
    )


def test_roll_hostile_device_list_is_refused_not_run(write_yaml, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = write_yaml(
        "h.yaml",
        "pretrain: m\nactor_train:\n  device_mapping: "
        f"list(range(__import__('os').system('touch {marker}')))\n",
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (issue,) = info.value.issues
    assert issue.path == "actor_train.device_mapping"
    assert "never evaluated" in issue.message
    assert not marker.exists()


def test_roll_device_list_parsed_from_yaml(write_yaml) -> None:
    path = write_yaml(
        "d.yaml",
        "pretrain: m\nnum_gpus_per_node: 8\nrollout_batch_size: 12\n"
        "actor_train:\n  device_mapping: list(range(0,6))\n"
        "actor_infer:\n  device_mapping: list(range(6, 8)) + [0]\n",
    )
    cfg = load_config(path)
    assert cfg.actor_train.device_mapping == [0, 1, 2, 3, 4, 5]
    assert cfg.actor_infer.device_mapping == [6, 7, 0]


def test_roll_accepted_keys_are_named_in_warnings() -> None:
    cfg = ExperimentConfig.model_validate(
        {
            "pretrain": "m",
            "global_template": "qwen2_5",
            "error_max_len_clip": False,  # unset: off either way, no warning
            "rollout_dump_dir": "dumps",
            "actor_train": {"model_args": {"flash_attn": "fa2", "ulysses_size": 2}},
            "reference": {"strategy_args": {"strategy_name": "fsdp2_infer"}},
            "reward_norm": "None",
        }
    )
    warnings = cfg.config_warnings()
    # an RLVR config: ROLL's global_template is read by the SFT pipeline only
    assert any(w.startswith("global_template='qwen2_5' has no effect: SFT only") for w in warnings)
    assert any(w.startswith("rollout_dump_dir: not supported") for w in warnings)
    assert any(
        w.startswith("actor_train.model_args.flash_attn: ignored, as ROLL ignores it")
        for w in warnings
    )
    assert any(w.startswith("actor_train.model_args.ulysses_size: not supported") for w in warnings)
    assert not any(w.startswith("error_max_len_clip") for w in warnings)
    assert cfg.reference.strategy_args.strategy_name == "fsdp2_train"
    assert cfg.reward_norm is None


def test_roll_unknown_keys_still_fail_with_suggestion() -> None:
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.model_validate(
            {
                "pretrain": "m",
                "difficulty_mask": True,
                "actor_train": {"model_args": {"flash_atn": 1}},
            }
        )
    (issue,) = info.value.issues
    assert issue.path == "actor_train.model_args.flash_atn"
    assert "did you mean" in issue.message


def test_roll_agentic_reinforce_refused_with_alternative() -> None:
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.model_validate({"pretrain": "m", "adv_estimator": "agentic_reinforce"})
    (issue,) = info.value.issues
    assert issue.path == "adv_estimator" and "use reinforce" in issue.message


def test_roll_step_reinforce_is_accepted() -> None:
    cfg = ExperimentConfig.model_validate(
        {"pretrain": "m", "adv_estimator": "step_reinforce", "step_reward_gamma": 1.0}
    )
    assert (cfg.adv_estimator, cfg.step_reward_gamma) == ("step_reinforce", 1.0)


def test_roll_compat_tables_are_plain_and_disjoint() -> None:
    for table in (ROLL_IGNORED, ROLL_NOT_SUPPORTED, MEGATRON_ONLY):
        assert all(isinstance(k, str) and isinstance(v, str) and v for k, v in table.items())
    assert not set(ROLL_IGNORED) & set(ROLL_NOT_SUPPORTED)
    assert matches("ROLE.model_args.flash_attn", "critic.model_args.flash_attn")
    assert not matches("ROLE.model_args.flash_attn", "custom_envs.model_args.flash_attn")
    assert matches("*_env_manager.n_groups", "val_env_manager.n_groups")
    assert matches("ROLE.data_args.video_*", "actor_train.data_args.video_fps")


def test_roll_strip_does_not_touch_schema_keys_or_input() -> None:
    data = {"seed": 1, "actor_train": {"use_remove_padding": True, "infer_batch_size": 2}}
    out, notes = strip_roll_keys(data)
    assert out == {"seed": 1, "actor_train": {"infer_batch_size": 2}}
    assert [n.path for n in notes] == ["actor_train.use_remove_padding"]
    assert data["actor_train"]["use_remove_padding"] is True


def test_roll_fsdp2_options_are_translated_or_refused() -> None:
    fsdp = {"strategy_name": "fsdp2_train", "strategy_config": {}}
    cfg = ExperimentConfig.model_validate(
        {
            "pretrain": "m",
            "actor_train": {
                "strategy_args": {
                    **fsdp,
                    "strategy_config": {
                        "fsdp_size": 16,
                        "param_dtype": "bf16",
                        "reduce_dtype": "float32",
                        "offload_policy": True,
                    },
                }
            },
        }
    )
    assert cfg.actor_train.strategy_args.strategy_config == {
        "param_dtype": "bf16",
        "reduce_dtype": "fp32",
        "cpu_offload": True,
    }
    assert any("strategy_config.fsdp_size: not supported" in w for w in cfg.config_warnings())
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.model_validate(
            {
                "pretrain": "m",
                "actor_train": {"strategy_args": {**fsdp, "strategy_config": {"cpu_ofload": 1}}},
            }
        )
    (issue,) = info.value.issues
    assert issue.path == "actor_train.strategy_args.strategy_config.cpu_ofload"
    assert "did you mean 'cpu_offload'?" in issue.message


def test_roll_fsdp2_options_match_the_backend() -> None:
    native = pytest.importorskip("rl_train.backends.native")
    from rl_config.schema.worker import FSDP2_OPTIONS

    assert set(FSDP2_OPTIONS) == set(native._FSDP_KEYS)
