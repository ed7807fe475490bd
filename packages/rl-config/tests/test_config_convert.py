"""rl-config convert: Megatron -> FSDP2/DeepSpeed, parallel sizes folded, a note per dropped key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_config import ConfigError, load_config
from rl_config.convert import FSDP2_STRATEGY_CONFIG as FSDP2_CONFIG
from rl_config.convert import convert_file

MEGATRON_YAML = """\
defaults:
  - ../config/deepspeed_zero@_here_
exp_name: conv
pretrain: Qwen/Qwen2.5-0.5B
rollout_batch_size: 8
num_return_sequences_in_group: 4
num_gpus_per_node: 8
tp: 2
actor_train:
  training_args:
    per_device_train_batch_size: 1
    gradient_accumulation_steps: 8
  strategy_args:
    strategy_name: megatron_train
    strategy_config:
      tensor_model_parallel_size: ${tp}
      pipeline_model_parallel_size: 2
      expert_model_parallel_size: 1
      use_distributed_optimizer: true
      recompute_granularity: full
  device_mapping: list(range(0,8))
actor_infer:
  strategy_args:
    strategy_name: sglang
    strategy_config:
      mem_fraction_static: 0.7
      load_format: dummy
  device_mapping: list(range(0,8))
reference:
  strategy_args:
    strategy_name: megatron_infer
    strategy_config:
      tensor_model_parallel_size: 1
  device_mapping: list(range(0,8))
tracker_kwargs:
  api_key: ${oc.env:SOME_SECRET_FOR_TEST}
"""


@pytest.fixture
def megatron_yaml(write_yaml) -> Path:
    return write_yaml("run/megatron.yaml", MEGATRON_YAML)


@pytest.mark.parametrize("target", ["fsdp2", "deepspeed"])
def test_convert_megatron_to_target_passes_check(
    megatron_yaml: Path, tmp_path: Path, target: str
) -> None:
    out = tmp_path / "out" / f"{target}.yaml"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rl_config.cli",
            "convert",
            str(megatron_yaml),
            "--strategy",
            target,
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "SOME_SECRET_FOR_TEST": "s3cret"},
    )
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert "s3cret" not in text  # the env reference is kept, not its value
    assert "${oc.env:SOME_SECRET_FOR_TEST}" in text
    cfg = load_config(out)
    train = "fsdp2_train" if target == "fsdp2" else "deepspeed_train"
    assert cfg.actor_train.strategy_args.strategy_name == train
    assert cfg.reference.strategy_args.strategy_name == train
    assert cfg.actor_infer.strategy_args.strategy_name == "vllm"
    assert cfg.actor_infer.strategy_args.strategy_config == {
        "gpu_memory_utilization": 0.7,
        "load_format": "dummy",
    }
    # tensor 2 × pipeline 2 fold into data parallelism: 8 ranks, accumulation 8 -> 2
    assert cfg.actor_train.world_size == 8
    assert cfg.actor_train.training_args.gradient_accumulation_steps == 2
    for key in ("tensor_model_parallel_size", "use_distributed_optimizer", "recompute_granularity"):
        assert f"note: dropped actor_train.strategy_args.strategy_config.{key}=" in result.stderr
    assert "note: dropped reference.strategy_args.strategy_config.tensor_model_parallel_size" in (
        result.stderr
    )
    if target == "deepspeed":
        options = cfg.actor_train.strategy_args.strategy_config or {}
        assert options["zero_optimization"]["stage"] == 3


def test_convert_keeps_accumulation_when_not_divisible(write_yaml) -> None:
    path = write_yaml(
        "m.yaml",
        MEGATRON_YAML.replace("gradient_accumulation_steps: 8", "gradient_accumulation_steps: 3"),
    )
    conversion = convert_file(path, "fsdp2")
    assert conversion.data["actor_train"]["training_args"]["gradient_accumulation_steps"] == 3
    assert any("kept 3, not divisible by 4" in n for n in conversion.notes)


def test_convert_keeps_megatron_warmup_under_a_constant_schedule(write_yaml, tmp_path) -> None:
    """Megatron warms up under every decay style; constant here has none (a config error)."""
    path = write_yaml(
        "m.yaml",
        MEGATRON_YAML.replace(
            "gradient_accumulation_steps: 8",
            "gradient_accumulation_steps: 8\n    lr_scheduler_type: constant\n    warmup_steps: 5",
        ),
    )
    conversion = convert_file(path, "fsdp2")
    training = conversion.data["actor_train"]["training_args"]
    assert training["lr_scheduler_type"] == "constant_with_warmup" and training["warmup_steps"] == 5
    assert any("constant -> constant_with_warmup" in n for n in conversion.notes)


def test_convert_refuses_bad_parallel_size(write_yaml) -> None:
    path = write_yaml(
        "m.yaml",
        MEGATRON_YAML.replace(
            "pipeline_model_parallel_size: 2", "pipeline_model_parallel_size: two"
        ),
    )
    with pytest.raises(ConfigError) as info:
        convert_file(path, "fsdp2")
    assert info.value.issues[0].path == (
        "actor_train.strategy_args.strategy_config.pipeline_model_parallel_size"
    )


def test_convert_cli_refuses_overwriting_input(megatron_yaml: Path) -> None:
    from rl_config.cli import main

    assert (
        main(["convert", str(megatron_yaml), "--strategy", "fsdp2", "-o", str(megatron_yaml)]) == 1
    )
    assert "megatron_train" in megatron_yaml.read_text()


OPD = Path(__file__).parent / "data/roll/head/examples/qwen3-8B-onpolicy-distill-megatron"


def test_roll_on_policy_distillation_converts_to_apps_distill_form():
    """ROLL's OPD examples: student_* become actor_*, the teacher(s) distill_app.teachers with
    ROLL's tag routing and opd_kl_coef, the teachers' Megatron strategy the reference's FSDP2
    (each named teacher converted too); before, convert silently dropped student_* and teacher
    (not schema keys) and wrote an RLVR config without them."""
    single = convert_file(OPD / "onpolicy_distill_config.yaml", "fsdp2")
    data = single.data
    assert not {"student_train", "student_infer", "teacher"} & set(data)
    assert data["actor_train"]["strategy_args"]["strategy_name"] == "fsdp2_train"
    assert data["actor_infer"]["strategy_args"]["strategy_name"] == "vllm"
    assert data["reference"] == {"strategy_args": {"strategy_name": "fsdp2_train",
                                                   "strategy_config": FSDP2_CONFIG}}  # fmt: skip
    assert data["distill_app"]["teachers"] == {"default": {
        "model": "Qwen/Qwen3-32B", "dtype": "bf16", "tags": [], "kl_coef": 1.0,
        "device_mapping": "list(range(0,16))", "infer_batch_size": 1}}  # fmt: skip
    assert "student_train -> actor_train (ROLL's OPD mapping)" in single.notes
    assert (
        "dropped teacher.sequence_packing_args (not read by apps/distill's teachers)"
        in single.notes
    )
    multi = convert_file(OPD / "multi_teacher_onpolicy_distill_config.yaml", "fsdp2").data
    teachers = multi["distill_app"]["teachers"]
    assert {n: (t["tags"], t["kl_coef"]) for n, t in teachers.items()} == {
        "teacher_32B": (["math_dapo"], 1.0), "teacher_14B": (["KodCode"], 1.0)}  # fmt: skip
    assert multi["reference"]["strategy_args"]["strategy_name"] == "fsdp2_train"


def test_rolls_mixed_opd_is_refused_by_name(tmp_path):
    src = OPD / "onpolicy_distill_config.yaml"
    path = tmp_path / "mixed.yaml"
    path.write_text(src.read_text() + "\nuse_opd: true\n")
    with pytest.raises(ConfigError, match="use_opd"):
        convert_file(path, "fsdp2")


def test_an_unconverted_roll_opd_config_names_the_conversion():
    with pytest.raises(ConfigError) as info:
        load_config(OPD / "onpolicy_distill_config.yaml")
    (issue,) = info.value.issues
    assert issue.path == "teacher" and "rl-config convert FILE" in issue.message
    assert "uv run apps/distill --config OUT" in issue.message
