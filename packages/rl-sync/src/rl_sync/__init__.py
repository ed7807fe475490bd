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
from rl_sync.group import CollectiveTimeoutError, CommError, CommGroup, init_group
from rl_sync.ipc import IpcHandle, IpcReceiver, IpcSender
from rl_sync.transfer import (
    ChecksumError,
    SyncError,
    SyncMetrics,
    VersionError,
    WeightReceiver,
    WeightSender,
    receive_into_engine,
    send_from_backend,
)

try:
    __version__ = version("rl-sync")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"

__all__ = [
    "ChecksumError",
    "CollectiveTimeoutError",
    "CommError",
    "CommGroup",
    "DeviceKind",
    "IpcHandle",
    "IpcReceiver",
    "IpcSender",
    "SyncError",
    "SyncMetrics",
    "VersionError",
    "WeightReceiver",
    "WeightSender",
    "__version__",
    "ascend_env_defaults",
    "backend_for",
    "detect_device_kind",
    "empty_cache",
    "init_group",
    "memory_stats",
    "ray_resource_name",
    "receive_into_engine",
    "reset_peak_memory_stats",
    "send_from_backend",
    "set_device",
    "synchronize",
    "torch_device",
    "visible_devices_env_var",
]
