"""Device-kind detection and the names that go with each kind (logic tested on CPU).

An NPU cannot exist here, so torch_npu is simulated by a fake module in ``sys.modules``; only the
decision logic is exercised with it.
"""

import sys
import types

import pytest
import torch

from rl_sync import device


class _FakeNpuApi:
    def __init__(self, available: bool) -> None:
        self.available = available
        self.calls: list[str] = []

    def is_available(self) -> bool:
        return self.available

    def device_count(self) -> int:
        return 8 if self.available else 0

    def synchronize(self) -> None:
        self.calls.append("synchronize")

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")

    def memory_allocated(self) -> int:
        return 3 << 30

    def memory_reserved(self) -> int:
        return 4 << 30

    def max_memory_allocated(self) -> int:
        return 5 << 30

    def reset_peak_memory_stats(self) -> None:
        self.calls.append("reset_peak")


@pytest.fixture
def fake_torch_npu(monkeypatch):
    """Install a fake ``torch_npu`` whose ``npu`` namespace reports the given availability."""

    def install(available: bool) -> _FakeNpuApi:
        api = _FakeNpuApi(available)
        module = types.ModuleType("torch_npu")
        module.npu = api  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "torch_npu", module)
        monkeypatch.delattr(torch, "npu", raising=False)
        return api

    monkeypatch.delenv(device.DEVICE_ENV_VAR, raising=False)
    return install


@pytest.fixture
def no_torch_npu(monkeypatch):
    monkeypatch.delenv(device.DEVICE_ENV_VAR, raising=False)
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import of torch_npu now fails
    monkeypatch.setattr(device.importlib.util, "find_spec", lambda name: None)


def test_backend_for_maps_each_kind():
    assert device.backend_for("npu") == "hccl"
    assert device.backend_for("cuda") == "nccl"
    assert device.backend_for("cpu") == "gloo"


def test_unknown_kind_is_an_error_naming_it():
    with pytest.raises(ValueError, match="'tpu'"):
        device.backend_for("tpu")  # type: ignore[arg-type]


def test_visible_devices_and_ray_resources():
    assert device.visible_devices_env_var("cuda") == "CUDA_VISIBLE_DEVICES"
    assert device.visible_devices_env_var("npu") == "ASCEND_RT_VISIBLE_DEVICES"
    assert device.visible_devices_env_var("cpu") is None
    assert device.ray_resource_name("cuda") == "GPU"
    assert device.ray_resource_name("npu") == "NPU"
    assert device.ray_resource_name("cpu") is None


def test_detect_without_torch_npu_falls_back_to_cuda_then_cpu(no_torch_npu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device.detect_device_kind() == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device.detect_device_kind() == "cpu"


def test_detect_prefers_available_npu_over_cuda(fake_torch_npu, monkeypatch):
    fake_torch_npu(available=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device.detect_device_kind() == "npu"
    assert device.backend_for(device.detect_device_kind()) == "hccl"


def test_installed_torch_npu_without_device_is_not_npu(fake_torch_npu, monkeypatch):
    fake_torch_npu(available=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device.detect_device_kind() == "cpu"


def test_env_override_wins_and_is_validated(fake_torch_npu, monkeypatch):
    fake_torch_npu(available=True)
    monkeypatch.setenv(device.DEVICE_ENV_VAR, "cpu")
    assert device.detect_device_kind() == "cpu"
    monkeypatch.setenv(device.DEVICE_ENV_VAR, "gpu")
    with pytest.raises(ValueError, match="RL_DEVICE='gpu'"):
        device.detect_device_kind()


def test_forcing_an_unavailable_kind_is_an_error(no_torch_npu, monkeypatch):
    monkeypatch.setenv(device.DEVICE_ENV_VAR, "npu")
    with pytest.raises(
        device.DeviceUnavailableError, match="torch_npu is not installed.*unset RL_DEVICE"
    ):
        device.detect_device_kind()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(device.DEVICE_ENV_VAR, "cuda")
    with pytest.raises(RuntimeError, match="no cuda device"):
        device.detect_device_kind()


def test_npu_operations_go_to_the_torch_npu_namespace(fake_torch_npu):
    api = fake_torch_npu(available=True)
    device.synchronize("npu")
    device.empty_cache("npu")
    device.reset_peak_memory_stats("npu")
    assert api.calls == ["synchronize", "empty_cache", "reset_peak"]
    assert device.memory_stats("npu") == {
        "allocated_gib": 3.0,
        "reserved_gib": 4.0,
        "peak_gib": 5.0,
    }
    assert device.device_count("npu") == 8


def test_cpu_operations_and_memory_stats_report_rss():
    device.synchronize("cpu")
    device.empty_cache("cpu")
    assert device.torch_device("cpu", local_rank=3) == torch.device("cpu")
    assert device.set_device(1, "cpu") == torch.device("cpu")
    before = device.memory_stats("cpu")
    assert set(before) >= {"allocated_gib", "reserved_gib", "peak_gib", "rss_gib"}
    assert 0.0 < before["rss_gib"] <= before["peak_gib"]
    device.reset_peak_memory_stats("cpu")
    block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB touched
    after = device.memory_stats("cpu")
    del block
    assert after["peak_gib"] >= before["rss_gib"] + 0.05


def test_torch_device_for_cuda_keeps_the_local_rank():
    assert device.torch_device("cuda", local_rank=2) == torch.device("cuda", 2)


def test_ascend_env_defaults_fill_without_overriding():
    defaults = device.ascend_env_defaults()
    assert defaults["VLLM_ASCEND_ENABLE_NZ"] == "0"
    assert int(defaults["HCCL_CONNECT_TIMEOUT"]) > 120
    assert int(defaults["HCCL_EXEC_TIMEOUT"]) > 0
    env = {"HCCL_EXEC_TIMEOUT": "7"}
    applied = device.apply_env_defaults("npu", env)
    assert env["HCCL_EXEC_TIMEOUT"] == "7"
    assert "HCCL_EXEC_TIMEOUT" not in applied
    assert env["HCCL_CONNECT_TIMEOUT"] == defaults["HCCL_CONNECT_TIMEOUT"]
    assert device.apply_env_defaults("cuda", {}) == {}
    # vLLM's sleep-mode allocator keeps expandable segments: the runtime never turns them on
    assert "PYTORCH_NPU_ALLOC_CONF" not in defaults
