"""How the trainer's weights reach the rollout engines: a broadcast over the sync group, or
shared memory when every engine shares the trainer's node.

`weight_sync_transport` (rl-config) asks for one of:
- ``broadcast``: rl_sync.transfer's versioned, checksummed buckets over the sync group (gloo on
  the CPU; works across nodes);
- ``shared_memory``: rl_sync.ipc on the CPU: the trainer packs the full weights into one
  ``/dev/shm`` buffer and sends only a small JSON handle over the sync group; each rollout worker
  maps the buffer, verifies the checksum and copies into its engine. One memory copy on the
  trainer's side instead of a socket transfer of every byte (tools/bench/sync.py: ~4x the
  broadcast's rate at 16 MB), which is the trainer's time the asynchronous pipeline gains;
- ``auto`` (default): shared memory where it can work, else broadcast.

Shared memory needs (`choose_sync_transport`): every rollout worker on the trainer's node, the
trainer's weights in host memory (a CPU trainer; accelerator trainers broadcast over their
collective), and room in ``/dev/shm`` for the weights with `SHM_HEADROOM` to spare (a container's
default /dev/shm is 64 MB). ``auto`` falls back to broadcast when one is missing; an explicit
``shared_memory`` is refused, naming the key and what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Transport = Literal["broadcast", "shared_memory"]
#: /dev/shm must hold the weights this many times over (other users of it: Ray, torch workers)
SHM_HEADROOM = 1.5


@dataclass(frozen=True)
class TransportChoice:
    transport: Transport
    #: why (for `--dry-run`-style reports and errors): what made the choice
    reason: str


def choose_sync_transport(
    requested: str,
    *,
    cross_node: bool,
    trainer_device: str,
    weight_bytes: int | None,
    shm_free_bytes: int | None,
) -> TransportChoice:
    """The transport a run uses for `requested` (`weight_sync_transport`). `weight_bytes` and
    `shm_free_bytes` are None when not measured (then shared memory is not possible). An
    explicit ``shared_memory`` that cannot work raises ``ConfigError`` at the key."""
    if requested == "broadcast":
        return TransportChoice("broadcast", "weight_sync_transport=broadcast")
    if requested not in ("auto", "shared_memory"):
        raise ValueError(f"unknown weight_sync_transport {requested!r}")
    missing = _shared_memory_missing(cross_node, trainer_device, weight_bytes, shm_free_bytes)
    if missing is None:
        return TransportChoice("shared_memory", "the trainer and every engine share a node")
    if requested == "auto":
        return TransportChoice("broadcast", missing)
    from rl_config.errors import ConfigError, ConfigIssue

    raise ConfigError([ConfigIssue("weight_sync_transport", f"shared_memory: {missing}")])


def _shared_memory_missing(
    cross_node: bool, trainer_device: str, weight_bytes: int | None, shm_free_bytes: int | None
) -> str | None:
    """What shared memory lacks here (None when it can work)."""
    if cross_node:
        return "a rollout worker runs on another node than the trainer"
    if trainer_device != "cpu":
        return (
            f"the trainer's weights live on {trainer_device}, not in host memory "
            "(shared memory is the CPU trainer's transport)"
        )
    if weight_bytes is None or shm_free_bytes is None:
        return "the weights' size or the free shared memory is unknown"
    need = int(weight_bytes * SHM_HEADROOM)
    if shm_free_bytes < need:
        return (
            f"the shared-memory directory has {shm_free_bytes / 2**20:.0f} MiB free, the weights "
            f"need {need / 2**20:.0f} MiB ({weight_bytes / 2**20:.0f} MiB x {SHM_HEADROOM})"
        )
    return None


def staging_room(weight_bytes: int | None, shm_free_bytes: int | None) -> bool:
    """Whether /dev/shm (`shm_free_bytes`, measured before any buffer was made) also holds the
    two alternating staging buffers of asynchronous training without partial rollout
    (rl_runtime.cluster.cluster.WeightSync.stage) beside the transport's own buffer and its headroom."""
    if weight_bytes is None or shm_free_bytes is None:
        return False
    return shm_free_bytes >= int(weight_bytes * (SHM_HEADROOM + 2))


def shm_free_bytes() -> int:
    """Free bytes in rl_sync's shared-memory directory (``/dev/shm``) for this user."""
    import os

    from rl_sync.ipc import shm_dir

    stat = os.statvfs(shm_dir())
    return int(stat.f_bavail * stat.f_frsize)


__all__ = [
    "SHM_HEADROOM",
    "Transport",
    "TransportChoice",
    "choose_sync_transport",
    "shm_free_bytes",
    "staging_room",
]
