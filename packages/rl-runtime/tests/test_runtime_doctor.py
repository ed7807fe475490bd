"""rl-doctor's config checks (placement against the devices found, the rollout's Ascend settings)
on recorded hosts, and the command on this (CPU) host. No NPU here: the A3 host is a record."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rl_runtime.cli.doctor import _load, check_config, main
from rl_runtime.cluster.ray_setup import device_env_defaults
from rl_sync.doctor import HostFacts, NpuSmi

ROOT = Path(__file__).resolve().parents[3]
AGENTIC_CPU = ROOT / "apps" / "agentic" / "configs" / "cpu_default.yaml"

A3 = HostFacts(
    python="3.12.1",
    machine="aarch64",
    versions={
        "torch": "2.10.0",
        "torch-npu": "2.10.0.post4",
        "vllm": "0.23.0",
        "vllm-ascend": "0.23.0",
    },
    device_kind="npu",
    device_count=16,
    npu_smi=NpuSmi(cards=8, chips_per_card=2),
)


def _config(tmp_path: Path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return _load(path)


BASE = """
pretrain: ./model
num_gpus_per_node: {per_node}
actor_train:
  device_mapping: list(range(0, 4))
  strategy_args: {{strategy_name: fsdp2_train}}
actor_infer:
  device_mapping: list(range(4, 8))
  strategy_args:
    strategy_name: vllm
    strategy_config: {strategy_config}
"""


def test_a3_config_counting_cards_is_warned_and_one_counting_dies_fits(tmp_path) -> None:
    cards = check_config(_config(tmp_path, BASE.format(per_node=8, strategy_config="{}")), A3)
    a3 = [f for f in cards if f.topic == "A3"]
    assert a3 and a3[0].level == "warn" and "num_gpus_per_node: 16" in a3[0].fix
    dies = check_config(_config(tmp_path, BASE.format(per_node=16, strategy_config="{}")), A3)
    assert not any(f.level in ("warn", "error") for f in dies), [f.line() for f in dies]


def test_more_devices_than_the_host_has_is_an_error(tmp_path) -> None:
    host = dataclasses.replace(A3, device_count=4, npu_smi=None)
    found = check_config(_config(tmp_path, BASE.format(per_node=8, strategy_config="{}")), host)
    errors = [f for f in found if f.level == "error"]
    assert errors and "sees 4 npu device(s)" in errors[0].message
    assert "ASCEND_RT_VISIBLE_DEVICES" in errors[0].fix


def test_nz_weights_in_the_rollout_config_are_an_error_and_prefix_caching_is_named(
    tmp_path,
) -> None:
    text = BASE.format(per_node=16, strategy_config="{additional_config: {weight_nz_mode: 2}}")
    found = {f.topic: f for f in check_config(_config(tmp_path, text), A3)}
    assert found["weight_nz_mode"].level == "error"
    assert "enable_prefix_caching: false" in found["enable_prefix_caching"].fix


def test_rl_doctor_on_this_cpu_host_with_the_agentic_config(capsys) -> None:
    assert main(["--config", str(AGENTIC_CPU)]) == 0
    out = capsys.readouterr().out
    assert "[ok] device: cpu, 1 device(s)" in out and "[ok] placement:" in out
    assert "checked on this host: cpu x 1; 0 error(s)" in out


def test_rl_doctor_exits_1_on_a_config_error(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("pretrain: ./m\nnot_a_key: 1\n")
    assert main(["--config", str(bad)]) == 1
    assert "[error] config:" in capsys.readouterr().out


def test_the_runtime_prints_and_applies_npu_defaults_the_user_left_unset(capsys) -> None:
    applied = device_env_defaults("npu", {"HCCL_EXEC_TIMEOUT": "3600"}, environ={})
    assert applied["VLLM_ASCEND_ENABLE_NZ"] == "0" and "HCCL_EXEC_TIMEOUT" not in applied
    assert "npu env defaults for every worker" in capsys.readouterr().out
    assert device_env_defaults("cpu", {}, environ={}) == {}
    assert capsys.readouterr().out == ""
