"""Devices, process groups and versioned weight transfer from trainers to rollout engines (torch only)."""

from importlib.metadata import PackageNotFoundError, version

from rl_sync.device import (
    DeviceKind,
    ascend_env_defaults,
    backend_for,
    detect_device_kind,
    empty_cache,
    memory_stats,
    ray_resource_name,
    reset_peak_memory_stats,
    set_device,
    synchronize,
    torch_device,
    visible_devices_env_var,
)

try:
    __version__ = version("rl-sync")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"

__all__ = [
    "DeviceKind",
    "__version__",
    "ascend_env_defaults",
    "backend_for",
    "detect_device_kind",
    "empty_cache",
    "memory_stats",
    "ray_resource_name",
    "reset_peak_memory_stats",
    "set_device",
    "synchronize",
    "torch_device",
    "visible_devices_env_var",
]
