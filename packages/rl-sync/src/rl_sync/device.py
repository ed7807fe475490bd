"""The one place that knows device kinds (cpu / cuda / npu).

Everything else in the workspace asks this module which device it runs on, which collective backend
goes with it, how to select/synchronise/measure it, and which environment variables and Ray resource
names belong to it. No other module compares device strings.

``torch_npu`` (Ascend) is imported lazily, only when it is installed, so importing this module on a
CPU or CUDA host never touches it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import resource
import sys
from types import ModuleType
from typing import Any, Literal, cast, get_args

import torch

DeviceKind = Literal["cpu", "cuda", "npu"]
BackendName = Literal["gloo", "nccl", "hccl"]

DEVICE_KINDS: tuple[DeviceKind, ...] = get_args(DeviceKind)
DEVICE_ENV_VAR = "RL_DEVICE"
"""Environment override for :func:`detect_device_kind` (``cpu``, ``cuda`` or ``npu``)."""

_BACKENDS: dict[DeviceKind, BackendName] = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
_VISIBLE_DEVICES_ENV: dict[DeviceKind, str | None] = {
    "cpu": None,
    "cuda": "CUDA_VISIBLE_DEVICES",
    "npu": "ASCEND_RT_VISIBLE_DEVICES",
}
_RAY_RESOURCES: dict[DeviceKind, str | None] = {"cpu": None, "cuda": "GPU", "npu": "NPU"}
_GIB = float(1 << 30)


# ----------------------------------------------------------------------------------------------
# Detection
# ----------------------------------------------------------------------------------------------
def torch_npu_module() -> ModuleType | None:
    """``torch_npu`` if it is installed and imports cleanly, else None (imported on first call)."""
    module = sys.modules.get("torch_npu")
    if module is not None:
        return module
    if importlib.util.find_spec("torch_npu") is None:
        return None
    try:
        return importlib.import_module("torch_npu")
    except Exception:  # a broken CANN install must not break CPU/CUDA hosts
        return None


def _npu_api() -> Any | None:
    """The ``torch.npu``-style accelerator namespace registered by torch_npu, or None."""
    module = torch_npu_module()
    if module is None:
        return None
    api = getattr(torch, "npu", None)
    if api is None:
        api = getattr(module, "npu", None)
    return api


def is_available(kind: DeviceKind) -> bool:
    """True if at least one device of ``kind`` can be used by this process."""
    kind = _check_kind(kind)
    if kind == "cpu":
        return True
    if kind == "cuda":
        return bool(torch.cuda.is_available())
    api = _npu_api()
    if api is None:
        return False
    try:
        return bool(api.is_available())
    except Exception:
        return False


def detect_device_kind() -> DeviceKind:
    """npu if torch_npu is importable and a device is available, else cuda if available, else cpu.

    ``RL_DEVICE=cpu|cuda|npu`` overrides the detection; forcing a kind that is not available is an
    error (rather than silently running somewhere else).
    """
    forced = os.environ.get(DEVICE_ENV_VAR, "").strip().lower()
    if forced:
        if forced not in DEVICE_KINDS:
            raise ValueError(
                f"{DEVICE_ENV_VAR}={forced!r} is not a device kind; expected one of {DEVICE_KINDS}"
            )
        kind = cast(DeviceKind, forced)
        if not is_available(kind):
            raise DeviceUnavailableError(
                f"{DEVICE_ENV_VAR}={kind} but no {kind} device is available in this process"
                + _why_unavailable(kind)
            )
        return kind
    if is_available("npu"):
        return "npu"
    if is_available("cuda"):
        return "cuda"
    return "cpu"


class DeviceUnavailableError(RuntimeError):
    """``RL_DEVICE`` names a device kind this process cannot use; the message names the fix."""


def _why_unavailable(kind: DeviceKind) -> str:
    if kind == "npu":
        if importlib.util.find_spec("torch_npu") is None:
            reason = "torch_npu is not installed"
        elif torch_npu_module() is None:
            reason = "torch_npu is not importable: CANN not sourced or torch-npu / torch mismatched"
        else:
            reason = "torch_npu imports but reports no NPU"
        return (
            f" ({reason}); install the torch-npu build of this torch and source CANN's "
            f"set_env.sh, or unset {DEVICE_ENV_VAR}; `rl-doctor` checks the stack"
        )
    if kind == "cuda":
        return f" (torch {torch.__version__} sees no CUDA device); unset {DEVICE_ENV_VAR} or fix the driver"
    return ""


def _check_kind(kind: str) -> DeviceKind:
    if kind not in DEVICE_KINDS:
        raise ValueError(f"unknown device kind {kind!r}; expected one of {DEVICE_KINDS}")
    return cast(DeviceKind, kind)


def _resolve(kind: DeviceKind | None) -> DeviceKind:
    return detect_device_kind() if kind is None else _check_kind(kind)


def kind_of(device: torch.device | str) -> DeviceKind:
    """The device kind of a torch device (``cuda:1`` -> cuda); unknown types are an error."""
    device_type = torch.device(device).type if isinstance(device, str) else device.type
    return _check_kind(device_type)


# ----------------------------------------------------------------------------------------------
# Names that go with a kind
# ----------------------------------------------------------------------------------------------
def backend_for(kind: DeviceKind) -> BackendName:
    """Collective backend of a device kind: cpu -> gloo, cuda -> nccl, npu -> hccl."""
    return _BACKENDS[_check_kind(kind)]


def visible_devices_env_var(kind: DeviceKind) -> str | None:
    """The env var that restricts visible devices (``CUDA_VISIBLE_DEVICES`` ...), None for cpu."""
    return _VISIBLE_DEVICES_ENV[_check_kind(kind)]


def ray_resource_name(kind: DeviceKind) -> str | None:
    """Ray's custom/accelerator resource of a kind (``GPU``/``NPU``), None for cpu."""
    return _RAY_RESOURCES[_check_kind(kind)]


def ascend_env_defaults() -> dict[str, str]:
    """Environment defaults for Ascend workers (set them where not already set).

    HCCL timeouts are raised well above their defaults (first-time graph compilation and large
    syncs exceed them) and the NZ weight format is disabled for vllm-ascend (needed for in-place
    weight updates). ``PYTORCH_NPU_ALLOC_CONF=expandable_segments:True`` is not set: vLLM's
    sleep-mode allocator does not release expandable segments (vllm-ascend's RL switch removes
    it). The runtime prints the defaults it applies when it starts workers.
    """
    return {
        "HCCL_CONNECT_TIMEOUT": "1200",
        "HCCL_EXEC_TIMEOUT": "1800",
        "VLLM_ASCEND_ENABLE_NZ": "0",
        "TASK_QUEUE_ENABLE": "1",
    }


def apply_env_defaults(kind: DeviceKind, env: dict[str, str] | None = None) -> dict[str, str]:
    """Fill device-specific defaults into ``env`` (default ``os.environ``) without overriding.

    Returns the variables that were set.
    """
    target: Any = os.environ if env is None else env
    defaults = ascend_env_defaults() if _check_kind(kind) == "npu" else {}
    applied = {k: v for k, v in defaults.items() if k not in target}
    for key, value in applied.items():
        target[key] = value
    return applied


# ----------------------------------------------------------------------------------------------
# Operations on the current device
# ----------------------------------------------------------------------------------------------
def _accelerator(kind: DeviceKind) -> Any:
    """``torch.cuda`` / ``torch.npu`` namespace of an accelerator kind."""
    if kind == "cuda":
        return torch.cuda
    if kind == "npu":
        api = _npu_api()
        if api is None:
            raise RuntimeError("device kind npu requested but torch_npu is not importable")
        return api
    raise ValueError(f"{kind!r} is not an accelerator kind")


def device_count(kind: DeviceKind | None = None) -> int:
    """Number of visible devices of a kind (1 for cpu)."""
    kind = _resolve(kind)
    if kind == "cpu":
        return 1
    return int(_accelerator(kind).device_count()) if is_available(kind) else 0


def torch_device(kind: DeviceKind | None = None, local_rank: int = 0) -> torch.device:
    """``torch.device`` for a kind and local rank (cpu ignores the rank)."""
    kind = _resolve(kind)
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "npu":
        torch_npu_module()  # registers the "npu" device type with torch
    return torch.device(kind, local_rank)


def set_device(local_rank: int, kind: DeviceKind | None = None) -> torch.device:
    """Make ``local_rank`` the current device of this process (no-op on cpu); returns it."""
    kind = _resolve(kind)
    device = torch_device(kind, local_rank)
    if kind != "cpu":
        _accelerator(kind).set_device(device)
    return device


def synchronize(kind: DeviceKind | None = None) -> None:
    """Wait for all queued work on the current device (no-op on cpu)."""
    kind = _resolve(kind)
    if kind != "cpu":
        _accelerator(kind).synchronize()


def empty_cache(kind: DeviceKind | None = None) -> None:
    """Return cached allocator blocks to the device (no-op on cpu)."""
    kind = _resolve(kind)
    if kind != "cpu":
        _accelerator(kind).empty_cache()


def _proc_status_kib(field: str) -> float | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def memory_stats(kind: DeviceKind | None = None) -> dict[str, float]:
    """Memory of this process in GiB: ``allocated_gib``, ``reserved_gib``, ``peak_gib``.

    On accelerators these are the caching allocator's allocated / reserved / peak-allocated bytes
    of the current device. On cpu all three describe the process RSS (``rss_gib`` = allocated =
    reserved; ``peak_gib`` = high-water mark since the last :func:`reset_peak_memory_stats`).
    """
    kind = _resolve(kind)
    if kind == "cpu":
        rss_kib = _proc_status_kib("VmRSS")
        hwm_kib = _proc_status_kib("VmHWM")
        if rss_kib is None:  # non-Linux: only the lifetime peak is known
            rss_kib = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        peak_kib = hwm_kib if hwm_kib is not None else rss_kib
        rss = rss_kib * 1024 / _GIB
        return {
            "allocated_gib": rss,
            "reserved_gib": rss,
            "peak_gib": max(peak_kib * 1024 / _GIB, rss),
            "rss_gib": rss,
        }
    api = _accelerator(kind)
    return {
        "allocated_gib": api.memory_allocated() / _GIB,
        "reserved_gib": api.memory_reserved() / _GIB,
        "peak_gib": api.max_memory_allocated() / _GIB,
    }


def reset_peak_memory_stats(kind: DeviceKind | None = None) -> None:
    """Restart peak tracking (on Linux cpu: resets VmHWM via /proc/self/clear_refs)."""
    kind = _resolve(kind)
    if kind != "cpu":
        _accelerator(kind).reset_peak_memory_stats()
        return
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass  # not Linux or not permitted: peak stays the lifetime maximum


__all__ = [
    "DEVICE_ENV_VAR",
    "DEVICE_KINDS",
    "BackendName",
    "DeviceKind",
    "DeviceUnavailableError",
    "apply_env_defaults",
    "ascend_env_defaults",
    "backend_for",
    "detect_device_kind",
    "device_count",
    "empty_cache",
    "is_available",
    "kind_of",
    "memory_stats",
    "ray_resource_name",
    "reset_peak_memory_stats",
    "set_device",
    "synchronize",
    "torch_device",
    "torch_npu_module",
    "visible_devices_env_var",
]
