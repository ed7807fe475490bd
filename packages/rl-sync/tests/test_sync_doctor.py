"""rl-doctor's host checks on recorded hosts: version tuples, env vars, fake npu-smi / CANN files.

No NPU here: every Ascend host below is a record (what collect_facts would read there), never a
claim that a check ran on Ascend hardware."""

from __future__ import annotations

import dataclasses
import os
import stat

import pytest

from rl_sync import device, doctor
from rl_sync.doctor import Finding, HostFacts, NpuSmi

DEFAULTS = {
    "HCCL_CONNECT_TIMEOUT": "1200",
    "HCCL_EXEC_TIMEOUT": "1800",
    "VLLM_ASCEND_ENABLE_NZ": "0",
}

# vllm-ascend 0.11 on an Atlas 800T A2 (910B), Python 3.10 (the verl-on-Ascend recipe's stack)
HOST_910B = HostFacts(
    python="3.10.13",
    machine="aarch64",
    versions={
        "torch": "2.7.1",
        "torch-npu": "2.7.1.post4",
        "vllm": "0.11.0",
        "vllm-ascend": "0.11.0",
        "transformers": "4.57.1",
        "ray": "2.51.1",
        "deepspeed": "0.17.6",
    },
    device_kind="npu",
    device_count=8,
    env={"HCCL_HOST_SOCKET_PORT_RANGE": "60000-60050"},
    cann_version="8.3.RC1",
    cann_file="/usr/local/Ascend/ascend-toolkit/latest/aarch64-linux/ascend_toolkit_install.info",
    npu_smi=NpuSmi(cards=8, chips_per_card=1),
    npu_name="Ascend910B2",
)
# vllm-ascend 0.23 on an Atlas 800T A3: 8 cards x 2 dies = 16 devices, Python 3.12
HOST_A3 = dataclasses.replace(
    HOST_910B,
    python="3.12.1",
    versions={
        "torch": "2.10.0",
        "torch-npu": "2.10.0.post4",
        "vllm": "0.23.0",
        "vllm-ascend": "0.23.0",
        "transformers": "5.5.4",
        "ray": "2.53.0",
        "deepspeed": None,
    },
    device_count=16,
    cann_version="9.1.0",
    npu_smi=NpuSmi(cards=8, chips_per_card=2),
    npu_name="Ascend910_9392",
)
HOST_CPU = HostFacts(
    python="3.11.7",
    machine="x86_64",
    versions={
        "torch": "2.13.0",
        "torch-npu": None,
        "vllm": None,
        "vllm-ascend": None,
        "transformers": "5.19.0",
        "ray": "2.60.0",
        "deepspeed": "0.19.8",
    },
    device_kind="cpu",
    device_count=1,
)
HOST_CUDA = dataclasses.replace(
    HOST_CPU, device_kind="cuda", device_count=8, versions={**HOST_CPU.versions, "vllm": "0.32.0"}
)


def _levels(findings: list[Finding]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in findings:
        out.setdefault(f.level, set()).add(f.topic)
    return out


@pytest.mark.parametrize(
    "host", [HOST_910B, HOST_A3, HOST_CPU, HOST_CUDA], ids=["910B", "A3", "cpu", "cuda"]
)
def test_healthy_hosts_have_no_error_or_warning(host: HostFacts) -> None:
    findings = doctor.diagnose(host, DEFAULTS)
    levels = _levels(findings)
    assert "error" not in levels and "warn" not in levels, [f.line() for f in findings]
    assert doctor.exit_code(findings) == 0
    assert f"{host.device_kind}, {host.device_count} device(s)" in findings[-1].message


def test_cpu_and_cuda_hosts_get_no_ascend_advice() -> None:
    for host in (HOST_CPU, HOST_CUDA):
        assert doctor.check_ascend_env(host, DEFAULTS) == []


def test_a3_reports_two_dies_per_card_and_the_runtime_defaults() -> None:
    findings = doctor.diagnose(HOST_A3, DEFAULTS)
    a3 = next(f for f in findings if f.topic == "A3")
    assert "8 cards x 2 dies = 16 devices" in a3.message and "num_gpus_per_node: 16" in a3.fix
    runtime = next(f for f in findings if f.topic == "runtime env defaults")
    assert (
        "VLLM_ASCEND_ENABLE_NZ=0" in runtime.message and "HCCL_EXEC_TIMEOUT=1800" in runtime.message
    )
    assert not any(f.topic == "A3" for f in doctor.diagnose(HOST_910B, DEFAULTS))


@pytest.mark.parametrize(
    ("versions", "topic", "fix"),
    [
        (
            {"torch": "2.8.0"},
            "torch-npu",
            "pip install torch==2.7.1",
        ),  # torch-npu built for another torch
        ({"vllm": "0.13.0"}, "vllm", "install vLLM 0.11.x"),  # vLLM of another vllm-ascend
        ({"torch": "2.8.0", "torch-npu": "2.8.0"}, "torch", "torch==2.7.1 torch-npu==2.7.1"),
        ({"transformers": "5.5.4"}, "transformers", "transformers<=4.57.1"),
        ({"vllm": None}, "vllm", "VLLM_TARGET_DEVICE=empty"),
        ({"vllm-ascend": None}, "vllm-ascend", "pip install vllm-ascend==0.11.0"),
        (
            {"torch": "2.6.0", "torch-npu": "2.6.0", "vllm-ascend": None, "vllm": None},
            "torch",
            "vllm-ascend >= 0.11 row",
        ),
    ],
    ids=[
        "torch-vs-torch-npu",
        "vllm-vs-vllm-ascend",
        "torch-vs-vllm-ascend",
        "transformers",
        "no-vllm",
        "no-vllm-ascend",
        "old-torch",
    ],
)
def test_each_known_bad_pairing_is_an_error_that_names_the_fix(versions, topic, fix) -> None:
    host = dataclasses.replace(HOST_910B, versions={**HOST_910B.versions, **versions})
    findings = doctor.diagnose(host, DEFAULTS)
    errors = [f for f in findings if f.level == "error" and f.topic == topic]
    assert errors and fix in errors[0].fix, [f.line() for f in findings]
    assert doctor.exit_code(findings) == 1


def test_cann_of_another_row_is_a_warning() -> None:
    host = dataclasses.replace(HOST_A3, cann_version="8.3.RC1")
    warn = [f for f in doctor.diagnose(host, DEFAULTS) if f.topic == "CANN"]
    assert warn[0].level == "warn" and "CANN 9.1" in warn[0].message
    missing = dataclasses.replace(HOST_A3, cann_version=None, cann_file=None)
    assert any(
        f.topic == "CANN" and "set_env.sh" in f.fix for f in doctor.diagnose(missing, DEFAULTS)
    )


def test_missing_torch_npu_is_an_error() -> None:
    host = dataclasses.replace(
        HOST_CPU,
        device_error="RL_DEVICE=npu but no npu device is available (torch_npu is not installed)",
    )
    findings = doctor.diagnose(host, DEFAULTS)
    assert findings[0].level == "error" and findings[0].topic == "device"
    assert "torch-npu" in findings[0].fix and doctor.exit_code(findings) == 1


@pytest.mark.parametrize(
    ("env", "level", "topic"),
    [
        ({"VLLM_ASCEND_ENABLE_NZ": "1"}, "error", "VLLM_ASCEND_ENABLE_NZ"),
        ({"HCCL_CONNECT_TIMEOUT": "120"}, "warn", "HCCL_CONNECT_TIMEOUT"),
        ({"HCCL_EXEC_TIMEOUT": "600"}, "warn", "HCCL_EXEC_TIMEOUT"),
        ({"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}, "warn", "PYTORCH_NPU_ALLOC_CONF"),
        ({"HCCL_NPU_SOCKET_PORT_RANGE": "15000-15100"}, "warn", "HCCL_NPU_SOCKET_PORT_RANGE"),
        ({"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "0"}, "warn", "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"),
    ],
)  # fmt: skip
def test_ascend_settings_that_break_rl(env, level, topic) -> None:
    host = dataclasses.replace(HOST_910B, env={**HOST_910B.env, **env})
    found = [f for f in doctor.diagnose(host, DEFAULTS) if f.topic == topic]
    assert found and found[0].level == level and found[0].fix


def test_the_runtime_defaults_the_user_set_are_not_reported_as_applied() -> None:
    host = dataclasses.replace(
        HOST_910B, env={"VLLM_ASCEND_ENABLE_NZ": "0", "HCCL_EXEC_TIMEOUT": "3600"}
    )
    runtime = next(f for f in doctor.diagnose(host, DEFAULTS) if f.topic == "runtime env defaults")
    assert runtime.message.endswith("HCCL_CONNECT_TIMEOUT=1200")


def test_release_reads_the_numbers_of_vendor_versions() -> None:
    assert doctor.release("2.7.1.post4") == (2, 7, 1)
    assert doctor.release("2.10.0+cpu") == (2, 10, 0)
    assert doctor.release("8.3.RC1") == (8, 3)
    assert doctor.stack_for("0.11.0rc1") is doctor.ASCEND_STACKS[0]
    assert doctor.stack_for("0.12.0") is None


def test_collect_facts_reads_a_fake_cann_file_and_npu_smi(tmp_path, monkeypatch) -> None:
    toolkit = tmp_path / "ascend-toolkit" / "latest"
    (toolkit / "aarch64-linux").mkdir(parents=True)
    (toolkit / "aarch64-linux" / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=9.1.0\ninnerversion=V100R001C25\n"
    )
    smi = tmp_path / "bin" / "npu-smi"
    smi.parent.mkdir()
    smi.write_text(
        "#!/bin/sh\n[ \"$1 $2\" = 'info -l' ] || exit 3\n"
        "printf '\\tTotal Count                    : 8\\n\\n'\n"
        "for i in 0 1 2 3 4 5 6 7; do printf '\\tNPU ID : %s\\n\\tChip Count : 2\\n\\n' $i; done\n"
    )
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    env = {"ASCEND_TOOLKIT_HOME": str(toolkit), "VLLM_ASCEND_ENABLE_NZ": "0", "HOME": "/x"}
    facts = doctor.collect_facts(env)
    assert facts.cann_version == "9.1.0" and str(facts.cann_file).endswith(
        "ascend_toolkit_install.info"
    )
    assert facts.npu_smi == NpuSmi(cards=8, chips_per_card=2)
    assert facts.env == {"ASCEND_TOOLKIT_HOME": str(toolkit), "VLLM_ASCEND_ENABLE_NZ": "0"}
    # this host's own device: never an NPU here (no torch_npu), whatever the recorded files say
    assert facts.device_kind == device.detect_device_kind() and facts.npu_name is None
    text = doctor.report(facts, doctor.diagnose(facts))
    assert "CANN: 9.1.0" in text and "npu-smi: 8 cards x 2 chips" in text


def test_collect_facts_turns_an_unusable_rl_device_into_a_finding(monkeypatch) -> None:
    monkeypatch.setattr(device, "torch_npu_module", lambda: None)
    monkeypatch.setattr(device.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv(device.DEVICE_ENV_VAR, "npu")
    facts = doctor.collect_facts()
    assert facts.device_error is not None and "torch_npu is not installed" in facts.device_error
    assert doctor.exit_code(doctor.diagnose(facts)) == 1
