"""Optional packages a config needs, with the exact install command, before anything starts."""

from __future__ import annotations

from typing import Any

from rl_config import ExperimentConfig
from rl_config.cli import main
from rl_config.extras import missing_extras, required_extras


def cfg_of(**extra: Any) -> ExperimentConfig:
    return ExperimentConfig.model_validate({"pretrain": "m", **extra})


def test_extras_follow_the_keys_that_need_them() -> None:
    cfg = cfg_of(
        track_with="wandb",
        actor_train={
            "strategy_args": {"strategy_name": "deepspeed_train"},
            "model_args": {"attn_implementation": "fa2"},
        },
        actor_infer={"strategy_args": {"strategy_name": "vllm"}},
        custom_envs={"Math": {"env_type": "single_turn", "env_config": {"reward": "math"}}},
    )
    found = {(e.key, e.module): e for e in required_extras(cfg)}
    assert set(found) == {
        ("track_with", "wandb"),
        ("actor_train.strategy_args.strategy_name", "deepspeed"),
        ("actor_train.model_args.attn_implementation", "flash_attn"),
        ("actor_infer.strategy_args.strategy_name", "vllm"),
        ("custom_envs.Math.env_type", "math_verify"),
    }
    assert "uv sync --extra wandb" in found[("track_with", "wandb")].install
    assert (
        "uv sync --extra vllm" in found[("actor_infer.strategy_args.strategy_name", "vllm")].install
    )
    # fa2 falls back to sdpa on CPU/NPU: never an error
    assert not found[("actor_train.model_args.attn_implementation", "flash_attn")].required


def test_extras_none_for_the_cpu_defaults() -> None:
    assert required_extras(cfg_of()) == []
    countdown = {"C": {"env_type": "single_turn", "env_config": {"reward": "countdown"}}}
    assert required_extras(cfg_of(custom_envs=countdown)) == []


def test_missing_extras_uses_the_import_probe() -> None:
    cfg = cfg_of(track_with="wandb")
    assert [e.module for e in missing_extras(cfg, importable=lambda m: False)] == ["wandb"]
    assert missing_extras(cfg, importable=lambda m: True) == []


def test_check_reports_a_missing_package_with_its_install_command(write_yaml, capsys) -> None:
    path = write_yaml(
        "w.yaml",
        "pretrain: m\ntrack_with: wandb\nactor_train:\n  model_args:\n    attn_implementation: fa2\n",
    )
    import importlib.util

    if importlib.util.find_spec("wandb") is not None:  # pragma: no cover - wandb installed
        return
    assert main(["check", "-q", str(path)]) == 0
    err = capsys.readouterr().err
    assert "warning: track_with: track_with: wandb needs the 'wandb' package" in err
    assert "actor_train.model_args.attn_implementation: attn_implementation fa2" in err
    assert main(["check", "-q", "--require-extras", str(path)]) == 1
    err = capsys.readouterr().err
    assert "error: track_with:" in err
    # flash-attn stays a warning even when extras are required
    assert "warning: actor_train.model_args.attn_implementation" in err
