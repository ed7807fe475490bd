"""Colocated weight updates: the trainer and the engine share memory instead of broadcasting.

The sender packs the full tensors into ONE persistent flat buffer (64-byte aligned slots, any mix
of dtypes) and exports a small JSON-serialisable :class:`IpcHandle` to it:

- cpu: a file in ``/dev/shm`` mapped with ``MAP_SHARED`` (``torch.from_file(shared=True)``);
- cuda: a CUDA IPC memory handle of the buffer's storage (``UntypedStorage._share_cuda_``);
- npu: the same through torch_npu's storage sharing (untestable here; the choice is tested).

The receiver checks the handle's digest (it covers the tensor table and every other field) before
it uses any field, maps the buffer once (cached across versions), verifies version and checksum,
and hands views of it to ``apply`` (which copies into the engine's parameters). The handle travels
over any channel: a :class:`~rl_sync.group.CommGroup` (``send_over`` / ``receive_over``), a Ray
object, a queue. Handles are JSON, never pickle. Views are valid until the sender's next export.

Zero-copy adoption (``IpcSender(device, num_buffers=2)`` + ``IpcReceiver(adopt=True)``): the sender
alternates between two buffers, so version v + 1 never overwrites the buffer of version v, and the
receiver hands ``apply`` views that the engine keeps AS its weights (e.g. ``param.data = view``)
instead of copying them. Contract:

- adopted tensors are read-only: the engine must not write into them (the memory is the sender's
  buffer; writes would be seen by every process mapping it and overwritten by a later export);
- the sender exports version v + 2 into the buffer of version v, so it may do so only after every
  receiver has applied v + 1 (in the colocated loop sync -> rollout -> train -> sync this holds by
  construction). A receiver that is handed a handle into the buffer it currently uses raises
  :class:`~rl_sync.transfer.SyncError` (a single-buffered sender, or the contract broken);
- the receiver holds a reference to the adopted buffer (the views hold one too) and drops the
  previous one only once the next version has been adopted, so the mapping lives as long as the
  engine's tensors refer to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import torch

from rl_sync.buckets import (
    as_bytes,
    check_shape,
    checksum,
    digest_problem,
    dtype_from_name,
    dtype_name,
    header_digest,
    padded,
)
from rl_sync.device import DeviceKind, detect_device_kind, kind_of, torch_device
from rl_sync.group import CommGroup
from rl_sync.transfer import (
    PROTOCOL,
    ApplyFn,
    ChecksumError,
    NamedTensors,
    SyncError,
    SyncMetrics,
    VersionError,
    _exchange_verdict,
    _recv_header,
    _send_header,
)

Transport = Literal["shm_file", "cuda_ipc", "npu_ipc"]
_ALIGN = 64
_HANDLE_PROTOCOL = "rl_sync.ipc/2"  # 2: a handle carries the digest of its fields


def ipc_transport(kind: DeviceKind) -> Transport:
    """How colocated processes share a buffer of a device kind (cpu -> shared-memory file)."""
    transports: dict[str, Transport] = {"cpu": "shm_file", "cuda": "cuda_ipc", "npu": "npu_ipc"}
    if kind not in transports:
        raise ValueError(f"unknown device kind {kind!r} for IPC")
    return transports[kind]


def shm_dir() -> str:
    """Where CPU shared buffers live: ``/dev/shm`` (RAM) when present, else the temp dir."""
    return (
        "/dev/shm"
        if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)
        else tempfile.gettempdir()
    )


@dataclass(frozen=True)
class IpcHandle:
    """A versioned pointer to a packed buffer another local process can map. JSON-serialisable.

    ``tensors`` rows are ``[name, dtype, shape, byte_offset, numel]``. ``checksum`` covers the
    buffer's bytes, ``digest`` (`rl_sync.buckets.header_digest`) every other field of the handle:
    `IpcSender.export` seals it, `IpcReceiver.open` checks it before it uses any field.
    """

    version: int
    transport: Transport
    location: dict[str, Any]
    nbytes: int
    checksum: int
    tensors: list[list[Any]] = field(default_factory=list)
    digest: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"protocol": _HANDLE_PROTOCOL, **asdict(self)}

    def seal(self) -> IpcHandle:
        """This handle with the digest of its fields."""
        return replace(self, digest=header_digest(self.to_json()))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> IpcHandle:
        if data.get("protocol") != _HANDLE_PROTOCOL:
            raise SyncError(
                f"IPC handle speaks {data.get('protocol')!r}, this receiver {_HANDLE_PROTOCOL!r} "
                f"(sender and receiver need the same rl-sync wire version): {data!r:.200}"
            )
        try:
            return cls(
                version=int(data["version"]),
                transport=data["transport"],
                location=dict(data["location"]),
                nbytes=int(data["nbytes"]),
                checksum=int(data["checksum"]),
                tensors=[list(row) for row in data["tensors"]],
                digest=str(data["digest"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SyncError(f"malformed IPC handle ({exc}): {data!r:.300}") from exc

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> IpcHandle:
        return cls.from_json(json.loads(data.decode()))


# ------------------------------------------------------------------------------------------------
# Buffers per transport
# ------------------------------------------------------------------------------------------------
_BUFFER_NAME = re.compile(r"rl_sync_(\d+)_[0-9a-f]{32}\.buf")


def remove_orphaned_buffers(directory: str | None = None) -> list[str]:
    """Remove the shared-memory buffers (``rl_sync_<pid>_<id>.buf``, this user's regular files
    only, never a link) whose sending process is gone: a sender killed before ``close`` (e.g.
    SIGKILL) leaves its buffer, as large as the weights, in RAM-backed ``/dev/shm``. Called when
    an `IpcSender` starts; returns the paths removed."""
    directory = directory or shm_dir()
    removed: list[str] = []
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            match = _BUFFER_NAME.fullmatch(entry.name)
            if match is None or _process_alive(int(match.group(1))):
                continue
            with contextlib.suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
                    os.unlink(entry.path)
                    removed.append(entry.path)
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _create_shm_buffer(nbytes: int) -> tuple[torch.Tensor, dict[str, Any]]:
    path = os.path.join(shm_dir(), f"rl_sync_{os.getpid()}_{uuid.uuid4().hex}.buf")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)
    buffer = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
    return buffer, {"path": path, "size": nbytes}


def _open_shm_buffer(location: dict[str, Any]) -> torch.Tensor:
    """Map a sender's buffer: only a file an `IpcSender` of this user made (its name, directly in
    `shm_dir()`, a regular file, not a link, owned by this user), at least `size` bytes."""
    path, size = str(location["path"]), int(location["size"])
    if os.path.dirname(os.path.abspath(path)) != os.path.abspath(shm_dir()):
        raise SyncError(f"IPC buffer path {path!r} is outside {shm_dir()}")
    if _BUFFER_NAME.fullmatch(os.path.basename(path)) is None:
        raise SyncError(f"IPC buffer path {path!r} is not an rl_sync buffer name")
    try:
        info = os.lstat(path)
    except OSError:
        raise SyncError(f"IPC buffer {path!r} is missing") from None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        raise SyncError(f"IPC buffer {path!r} is not a regular file of this user (a link?)")
    if info.st_size < size:
        raise SyncError(f"IPC buffer {path!r} is shorter than {size} bytes")
    return torch.from_file(path, shared=True, size=size, dtype=torch.uint8)


def _share_device_storage(buffer: torch.Tensor, transport: Transport) -> dict[str, Any]:
    storage = buffer.untyped_storage()
    share = getattr(storage, "_share_cuda_" if transport == "cuda_ipc" else "_share_npu_", None)
    if share is None:
        raise RuntimeError(
            f"this torch build cannot share {buffer.device.type} memory ({transport})"
        )
    (
        device,
        handle,
        size_bytes,
        offset_bytes,
        ref_counter_handle,
        ref_counter_offset,
        event_handle,
        event_sync_required,
    ) = share()

    def hex_or_none(value: Any) -> str | None:
        return None if value is None else bytes(value).hex()

    return {
        "device": int(device),
        "handle": hex_or_none(handle),
        "size_bytes": int(size_bytes),
        "offset_bytes": int(offset_bytes),
        "ref_counter_handle": hex_or_none(ref_counter_handle),
        "ref_counter_offset": int(ref_counter_offset),
        "event_handle": hex_or_none(event_handle),
        "event_sync_required": bool(event_sync_required),
    }


def _open_device_storage(
    location: dict[str, Any], transport: Transport, device: torch.device
) -> torch.Tensor:
    def raw(key: str) -> bytes | None:
        value = location.get(key)
        return None if value is None else bytes.fromhex(value)

    if transport == "cuda_ipc":
        torch.cuda._lazy_init()
        opener = torch.UntypedStorage._new_shared_cuda
    else:  # pragma: no cover - needs an Ascend NPU
        opener = getattr(torch.UntypedStorage, "_new_shared_npu", None)
        if opener is None:
            raise RuntimeError("torch_npu does not provide NPU IPC (_new_shared_npu) in this build")
    index = device.index if device.index is not None else int(location["device"])
    storage = opener(
        index,
        raw("handle"),
        int(location["size_bytes"]),
        int(location["offset_bytes"]),
        raw("ref_counter_handle"),
        int(location["ref_counter_offset"]),
        raw("event_handle"),
        bool(location["event_sync_required"]),
    )
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)


# ------------------------------------------------------------------------------------------------
# Sender / receiver
# ------------------------------------------------------------------------------------------------
class IpcSender:
    """Packs full tensors into persistent shareable buffers and exports handles to them.

    ``num_buffers=1`` (default): every export reuses one buffer (receivers must copy out before the
    next export). ``num_buffers=2``: exports alternate between two buffers, so receivers may adopt
    the mapped tensors zero-copy (``IpcReceiver(adopt=True)``; see the module docstring).
    """

    def __init__(self, device: torch.device | str | None = None, *, num_buffers: int = 1) -> None:
        if num_buffers not in (1, 2):
            raise ValueError(f"num_buffers must be 1 or 2, got {num_buffers!r}")
        self.device = torch_device(detect_device_kind()) if device is None else torch.device(device)
        self.transport: Transport = ipc_transport(kind_of(self.device))
        if self.transport == "shm_file":
            remove_orphaned_buffers()
        self.num_buffers = num_buffers
        self._buffers: list[torch.Tensor | None] = [None] * num_buffers
        self._locations: list[dict[str, Any]] = [{} for _ in range(num_buffers)]
        self._next_slot = 0

    def _ensure(self, slot: int, nbytes: int) -> torch.Tensor:
        buffer = self._buffers[slot]
        if buffer is None or buffer.numel() < nbytes:
            self._drop(slot)
            capacity = padded(max(nbytes, 8), _ALIGN)
            if self.transport == "shm_file":
                buffer, self._locations[slot] = _create_shm_buffer(capacity)
            else:
                buffer = torch.empty(capacity, dtype=torch.uint8, device=self.device)
                self._locations[slot] = _share_device_storage(buffer, self.transport)
            self._buffers[slot] = buffer
        return buffer

    def export(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> IpcHandle:
        """Pack ``named_tensors`` (one pass over a materialised list) and return the handle."""
        items = [(name, tensor.detach()) for name, tensor in named_tensors]
        rows: list[list[Any]] = []
        offset = 0
        seen: set[str] = set()
        for name, tensor in items:
            if name in seen:
                raise ValueError(f"tensor name {name!r} appears twice in one sync")
            seen.add(name)
            rows.append(
                [name, dtype_name(tensor.dtype), list(tensor.shape), offset, tensor.numel()]
            )
            offset = padded(offset + tensor.numel() * tensor.element_size(), _ALIGN)
        nbytes = max(offset, 8)
        slot = self._next_slot
        buffer = self._ensure(slot, nbytes)
        payload = buffer[:nbytes]
        for (_, tensor), (_, _, _, start, _) in zip(items, rows):
            size = tensor.numel() * tensor.element_size()
            if size:
                payload[start : start + size].copy_(as_bytes(tensor.contiguous()))
        if offset < nbytes:
            payload[offset:].zero_()
        _zero_gaps(payload, rows, items)
        self._next_slot = (slot + 1) % self.num_buffers
        return IpcHandle(
            version, self.transport, dict(self._locations[slot]), nbytes, checksum(payload), rows
        ).seal()

    def _drop(self, slot: int) -> None:
        path = self._locations[slot].get("path")
        self._buffers[slot] = None
        self._locations[slot] = {}
        if path and os.path.exists(path):
            os.unlink(path)

    def close(self) -> None:
        """Drop the buffers (removes the shared-memory files; mapped receivers keep their views)."""
        for slot in range(self.num_buffers):
            self._drop(slot)

    def send_over(
        self,
        group: CommGroup,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        version: int,
        *,
        src: int = 0,
        timeout_s: float | None = None,
    ) -> SyncMetrics:
        """Export and broadcast the handle over ``group``; fails if any receiver rejected it."""
        start = time.perf_counter()
        handle = self.export(named_tensors, version)
        _send_header(group, src, {**handle.to_json(), "protocol": PROTOCOL}, timeout_s)
        if _exchange_verdict(group, False, timeout_s):
            raise SyncError(
                f"IPC weight update version {version} was rejected by a receiver; nothing applied"
            )
        return SyncMetrics.measure(
            handle.nbytes, time.perf_counter() - start, version, 1, len(handle.tensors)
        )

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _zero_gaps(payload: torch.Tensor, rows: list[list[Any]], items: NamedTensors) -> None:
    """Zero the alignment padding between slots so the checksum covers defined bytes only."""
    for (_, tensor), row in zip(items, rows):
        end = row[3] + tensor.numel() * tensor.element_size()
        gap_end = padded(end, _ALIGN) if end % _ALIGN else end
        if gap_end > end:
            payload[end : min(gap_end, payload.numel())].zero_()


def _tensor_view(
    payload: torch.Tensor, row: list[Any], handle: IpcHandle
) -> tuple[str, torch.Tensor]:
    """The view of one ``[name, dtype, shape, byte_offset, numel]`` row of ``handle`` into its
    verified ``payload``; a row that is malformed or lies outside the buffer is a SyncError (the
    handle came from another process: ``receive_over`` answers a SyncError with a rejection the
    sender hears, anything else would leave it waiting for a verdict)."""
    try:
        name, dtype, shape, start, numel = row
        name, start, numel = str(name), int(start), int(numel)
        shape = tuple(int(d) for d in shape)
        torch_dtype = dtype_from_name(str(dtype))
        check_shape(name, shape, numel, where=f"IPC handle of version {handle.version}")
    except (TypeError, ValueError) as exc:
        raise SyncError(f"malformed IPC tensor row {row!r:.200}: {exc}") from exc
    size = numel * torch.empty((), dtype=torch_dtype).element_size()
    if start < 0 or start + size > handle.nbytes or start % torch_dtype.itemsize:
        raise SyncError(f"IPC tensor {name!r} lies outside the buffer")
    return name, payload[start : start + size].view(torch_dtype).view(shape)


_MAX_MAPPED = 2  # a double-buffered sender alternates between two buffers


def _location_key(location: dict[str, Any]) -> str:
    return json.dumps(location, sort_keys=True)


class IpcReceiver:
    """Maps exported buffers (once per buffer) and commits verified versions through ``apply``.

    ``adopt=False`` (default): ``apply`` gets views valid only during the call; it must copy them
    into the engine's tensors. ``adopt=True`` (needs ``IpcSender(num_buffers=2)``): ``apply`` gets
    read-only views of the mapped buffer that the engine keeps as its weights, zero-copy; this
    receiver keeps the buffer mapped until the next version has been adopted (module docstring).
    Verification (version, checksum, all-or-nothing) is the same in both modes.
    """

    def __init__(
        self,
        device: torch.device | str | None = None,
        *,
        last_version: int | None = None,
        adopt: bool = False,
    ) -> None:
        self.device = None if device is None else torch.device(device)
        self.last_version = last_version
        self.incoming_version: int | None = None
        self.adopt = adopt
        self._mapped: dict[str, torch.Tensor] = {}  # location key -> buffer, oldest first
        self._adopted: torch.Tensor | None = None  # the buffer the engine's weights live in
        self._adopted_key: str | None = None

    def _map(self, handle: IpcHandle) -> torch.Tensor:
        key = _location_key(handle.location)
        buffer = self._mapped.pop(key, None)
        if buffer is None:
            if handle.transport == "shm_file":
                buffer = _open_shm_buffer(handle.location)
            else:
                device = self.device or torch.device(
                    "cuda" if handle.transport == "cuda_ipc" else "npu",
                    int(handle.location["device"]),
                )
                buffer = _open_device_storage(handle.location, handle.transport, device)
            # a buffer whose file the sender removed (it re-allocated or closed) is dead
            for old_key in [k for k in self._mapped if not _still_exported(k)]:
                del self._mapped[old_key]
        self._mapped[key] = buffer  # most recently used last
        while len(self._mapped) > _MAX_MAPPED:
            del self._mapped[next(iter(self._mapped))]  # the adopted buffer stays in _adopted
        if buffer.numel() < handle.nbytes:
            raise SyncError(f"IPC buffer holds {buffer.numel()} bytes, handle says {handle.nbytes}")
        return buffer

    def open(self, handle: IpcHandle, *, expected_version: int | None = None) -> NamedTensors:
        """Verified views of the tensors behind ``handle`` (raises, applying nothing, on mismatch)."""
        corrupted = digest_problem(handle.to_json(), f"IPC handle of version {handle.version}")
        if corrupted:  # before any field is used: its location, sizes and tensor table
            raise ChecksumError(corrupted + "; nothing applied")
        if expected_version is not None and handle.version != expected_version:
            raise VersionError(
                f"IPC version {handle.version} received but {expected_version} was expected"
            )
        if (
            expected_version is None
            and self.last_version is not None
            and handle.version <= self.last_version
        ):
            raise VersionError(
                f"stale IPC version {handle.version}: this receiver already holds version {self.last_version}"
            )
        if self.adopt and _location_key(handle.location) == self._adopted_key:
            raise SyncError(
                f"IPC version {handle.version} was written into the buffer that holds the adopted "
                f"version {self.last_version}: the engine's weights were overwritten while in use "
                "(adopt=True needs IpcSender(num_buffers=2), exporting v + 2 only after v + 1 was "
                "applied); nothing applied"
            )
        payload = self._map(handle)[: handle.nbytes]
        actual = checksum(payload)
        if actual != handle.checksum:
            names = ", ".join(str(row[0]) for row in handle.tensors[:20])
            raise ChecksumError(
                f"checksum mismatch in IPC buffer of version {handle.version} (tensors: {names}): "
                f"computed {actual:#018x}, sender sent {handle.checksum:#018x}"
            )
        return [_tensor_view(payload, row, handle) for row in handle.tensors]

    def _commit(self, handle: IpcHandle, tensors: NamedTensors, apply: ApplyFn) -> None:
        self.incoming_version = handle.version
        apply(tensors)
        self.last_version = handle.version
        if self.adopt:  # the previous buffer is released only now that the next one is adopted
            key = _location_key(handle.location)
            self._adopted, self._adopted_key = self._mapped.get(key), key

    def receive(
        self, handle: IpcHandle, apply: ApplyFn, *, expected_version: int | None = None
    ) -> SyncMetrics:
        """Verify ``handle`` and commit it with ``apply(named_tensors)``."""
        start = time.perf_counter()
        tensors = self.open(handle, expected_version=expected_version)
        self._commit(handle, tensors, apply)
        return SyncMetrics.measure(
            handle.nbytes, time.perf_counter() - start, handle.version, 1, len(tensors)
        )

    def receive_over(
        self,
        group: CommGroup,
        apply: ApplyFn,
        *,
        src: int = 0,
        expected_version: int | None = None,
        timeout_s: float | None = None,
    ) -> SyncMetrics:
        """Receive a handle broadcast by :meth:`IpcSender.send_over` and commit it."""
        start = time.perf_counter()
        header = _recv_header(group, src, timeout_s)
        header["protocol"] = _HANDLE_PROTOCOL  # the group protocol wrapped an IPC handle
        try:
            handle = IpcHandle.from_json(header)
            tensors = self.open(handle, expected_version=expected_version)
        except SyncError:
            _exchange_verdict(group, True, timeout_s)
            raise
        if _exchange_verdict(group, False, timeout_s):
            raise SyncError(
                f"IPC version {handle.version} rejected by another receiver; nothing applied"
            )
        self._commit(handle, tensors, apply)
        return SyncMetrics.measure(
            handle.nbytes, time.perf_counter() - start, handle.version, 1, len(tensors)
        )


def _still_exported(key: str) -> bool:
    """False for a shared-memory buffer whose file the sender has removed."""
    path = json.loads(key).get("path")
    return path is None or os.path.exists(str(path))


__all__ = [
    "IpcHandle",
    "IpcReceiver",
    "IpcSender",
    "Transport",
    "ipc_transport",
    "remove_orphaned_buffers",
    "shm_dir",
]
