"""Versioned, verified, bucketed weight broadcast from a trainer rank to rollout engines.

Wire protocol over a :class:`~rl_sync.group.CommGroup` (``src`` = the sending rank, every other rank
receives). Per bucket: an int64 header length, the JSON header (version, bucket index, dtype, byte
count, payload checksum, tensor names/shapes/offsets, and the digest of all of these), then the
payload. The length and the header are each closed by a MAX all-reduce of every rank's verdict
(0 = accepted): a header refused anywhere (too long, not JSON, failing its digest) ends the sync on
every rank at that point, so the sender hears it at once and the group stays in step. After the
last bucket a final header carries the totals, and every rank joins one more verdict, so the sender
learns of a receiver's rejection and all receivers commit or none does.

Receivers stage every bucket, verify version, header digests and payload checksums, and only then
hand the tensors to the engine's ``apply`` callback: a corrupted or stale sync applies nothing.
Headers are JSON (never pickle) of at most ``MAX_HEADER_BYTES`` (refused before it is allocated),
dtypes are looked up by name.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import torch

from rl_sync.buckets import (
    BucketPacker,
    BucketSpec,
    TensorSlot,
    checksum,
    digest_problem,
    sealed,
    unpack,
)
from rl_sync.group import CommGroup, PendingOp

DEFAULT_BUCKET_BYTES = 256 << 20
PROTOCOL = "rl_sync/2"  # 2: every header carries the digest of its fields (`buckets.header_digest`)

MAX_HEADER_TENSORS = 1 << 17
"""Tensors one header may list: an IPC handle lists all of a model's (~1e5 for the largest MoE
checkpoints with per-expert weights and scales)."""
MAX_HEADER_ROW_BYTES = 512
"""JSON bytes of one row of a header's tensor table: a name of a few hundred characters, its
dtype, shape, offset and element count."""
MAX_HEADER_BYTES = MAX_HEADER_TENSORS * MAX_HEADER_ROW_BYTES
"""The largest header a receiver accepts (64 MiB); it refuses a longer announced length before
allocating it, and a sender refuses to send one."""

NamedTensors = list[tuple[str, torch.Tensor]]
ApplyFn = Callable[[NamedTensors], None]


class SyncError(RuntimeError):
    """A weight sync was rejected; nothing of it was applied."""


class ChecksumError(SyncError):
    """A bucket's bytes, or a header's fields (its tensor table), do not match the checksum or
    digest its sender computed."""


class VersionError(SyncError):
    """A sync carried a version the receiver does not accept (stale, repeated or unexpected)."""


@dataclass(frozen=True)
class SyncMetrics:
    """What one sync moved: payload ``bytes`` in ``seconds`` (``gbps`` = 1e9 bytes/s)."""

    bytes: int
    seconds: float
    gbps: float
    version: int
    num_buckets: int
    num_tensors: int = 0

    @classmethod
    def measure(
        cls, nbytes: int, seconds: float, version: int, buckets: int, tensors: int
    ) -> SyncMetrics:
        gbps = nbytes / seconds / 1e9 if seconds > 0 else 0.0
        return cls(nbytes, seconds, gbps, version, buckets, tensors)

    def as_dict(self, prefix: str = "sync/") -> dict[str, float]:
        """Flat metrics for trackers (``sync/gbps`` ...)."""
        return {
            f"{prefix}bytes": float(self.bytes),
            f"{prefix}seconds": self.seconds,
            f"{prefix}gbps": self.gbps,
            f"{prefix}version": float(self.version),
            f"{prefix}num_buckets": float(self.num_buckets),
            f"{prefix}num_tensors": float(self.num_tensors),
        }


# ------------------------------------------------------------------------------------------------
# Headers
# ------------------------------------------------------------------------------------------------
def _encode_header(header: dict[str, Any]) -> bytes:
    return json.dumps(header, separators=(",", ":")).encode()


def _tensor_bytes(body: torch.Tensor) -> bytes:
    """The bytes of a ``[N]`` uint8 tensor on any device (no numpy: rl-sync depends on torch only)."""
    buffer = bytearray(body.numel())
    if buffer:
        torch.frombuffer(buffer, dtype=torch.uint8).copy_(body)
    return bytes(buffer)


def _bucket_header(version: int, spec: BucketSpec) -> dict[str, Any]:
    return sealed(
        {
            "protocol": PROTOCOL,
            "version": version,
            "final": False,
            "index": spec.index,
            "dtype": spec.dtype,
            "nbytes": spec.nbytes,
            "checksum": spec.checksum,
            "tensors": [[s.name, list(s.shape), s.offset, s.numel] for s in spec.tensors],
        }
    )


def _spec_from_header(header: dict[str, Any]) -> BucketSpec:
    try:
        slots = tuple(
            TensorSlot(str(name), tuple(int(d) for d in shape), int(offset), int(numel))
            for name, shape, offset, numel in header["tensors"]
        )
        spec = BucketSpec(
            int(header["index"]),
            str(header["dtype"]),
            int(header["nbytes"]),
            int(header["checksum"]),
            slots,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise SyncError(
            f"malformed bucket header (field missing or wrong type: {exc}): {header!r:.300}"
        ) from exc
    if spec.nbytes < 0:
        raise SyncError(f"{spec.describe()}: negative size {spec.nbytes}")
    return spec


def _bucket_header_problem(position: int, header: dict[str, Any]) -> SyncError | None:
    """Why a received bucket (or final) header cannot be used, checked before any field is: its
    digest, an integer version, and a bucket's tensor table and sizes."""
    final = header.get("final") is True
    corrupted = digest_problem(header, "the final header" if final else f"header {position}")
    if corrupted:
        return ChecksumError(corrupted)
    if not isinstance(header.get("version"), int) or isinstance(header.get("version"), bool):
        return SyncError(f"sync header without an integer version: {header!r:.200}")
    if not final:
        try:
            _spec_from_header(header)
        except SyncError as exc:
            return exc
    return None


def _send_header(
    group: CommGroup, src: int, header: dict[str, Any], timeout_s: float | None
) -> None:
    """Broadcast ``header`` from ``src``; returns once every receiver accepted it.

    Two steps, each closed by every rank's verdict (`_exchange_verdict`): the length (refused
    above `MAX_HEADER_BYTES`, by the sender before it sends or by a receiver before it allocates),
    then the JSON body (refused by a receiver that cannot decode or check it). A refusal on any
    rank raises on every rank at the same point, so the sender hears it at once rather than at
    its timeout, and the group stays in step for the next sync.
    """
    data = _encode_header(header)
    too_long = len(data) > MAX_HEADER_BYTES
    length = torch.tensor([len(data)], dtype=torch.int64, device=group.device)
    group.broadcast(length, src, timeout_s)
    if _exchange_verdict(group, too_long, timeout_s):
        if too_long:
            raise SyncError(
                f"sync header of {len(data)} bytes exceeds the limit of {MAX_HEADER_BYTES} bytes "
                f"({MAX_HEADER_TENSORS} tensors of {MAX_HEADER_ROW_BYTES} bytes); not sent (a "
                f"bucket of fewer tensors, or shorter names, fits)"
            )
        raise SyncError(_refused_by_receiver(group, f"the length of a {len(data)}-byte header"))
    body = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(group.device)
    group.broadcast(body, src, timeout_s)
    if _exchange_verdict(group, False, timeout_s):
        raise SyncError(_refused_by_receiver(group, f"a {len(data)}-byte header"))


def _refused_by_receiver(group: CommGroup, what: str) -> str:
    return (
        f"sync rejected by a receiver of group {group.name!r}, which refused {what}; the sync "
        "stopped there and nothing of it was applied (the receiver's error says why)"
    )


HeaderCheck = Callable[[dict[str, Any]], SyncError | None]
"""A receiver's own check of a decoded header: the problem (not raised), or None."""


def _recv_header(
    group: CommGroup, src: int, timeout_s: float | None, check: HeaderCheck | None = None
) -> dict[str, Any]:
    """Receive one header sent by `_send_header`, joining its two verdicts.

    Refuses an implausible length, a body that is not a JSON object of this wire protocol, or
    one that fails ``check``; every rank then raises (this one its reason), nothing is applied.
    """
    length = torch.zeros(1, dtype=torch.int64, device=group.device)
    group.broadcast(length, src, timeout_s)
    size = int(length.item())
    _settle_header(group, src, _length_problem(size, src), timeout_s)
    body = torch.empty(size, dtype=torch.uint8, device=group.device)
    group.broadcast(body, src, timeout_s)
    header: dict[str, Any] = {}
    try:
        header = _decode_header(body, src)
        problem = check(header) if check is not None else None
    except SyncError as exc:
        problem = exc
    _settle_header(group, src, problem, timeout_s)
    return header


def _length_problem(size: int, src: int, limit: int = MAX_HEADER_BYTES) -> SyncError | None:
    if size <= 0:
        return SyncError(f"sync header length {size} from rank {src} is not plausible")
    if size > limit:
        return SyncError(
            f"sync header of {size} bytes announced by rank {src} exceeds the limit of "
            f"{limit} bytes ({MAX_HEADER_TENSORS} tensors of {MAX_HEADER_ROW_BYTES} "
            "bytes); refused before allocating it"
        )
    return None


def _decode_header(body: torch.Tensor, src: int) -> dict[str, Any]:
    """The JSON object in ``body`` ([N] uint8), of this wire protocol; SyncError otherwise."""
    try:
        header = json.loads(_tensor_bytes(body).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SyncError(f"sync header from rank {src} is not valid JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise SyncError(f"sync header from rank {src} is not a JSON object: {header!r:.200}")
    if header.get("protocol") != PROTOCOL:
        raise SyncError(
            f"sync header from rank {src} speaks {header.get('protocol')!r}, this receiver "
            f"{PROTOCOL!r} (sender and receiver need the same rl-sync wire version): "
            f"{header!r:.200}"
        )
    return header


def _settle_header(
    group: CommGroup, src: int, problem: SyncError | None, timeout_s: float | None
) -> None:
    """Exchange this rank's verdict on a header; raise if any rank refused it."""
    refused_elsewhere = _exchange_verdict(group, problem is not None, timeout_s)
    if problem is not None:
        raise type(problem)(
            f"sync header from rank {src} refused by rank {group.rank} of group "
            f"{group.name!r}; nothing applied: {problem}"
        ) from problem
    if refused_elsewhere:
        raise SyncError(
            f"a sync header from rank {src} was refused by another rank of group "
            f"{group.name!r}; nothing applied here either"
        )


def _exchange_verdict(group: CommGroup, rejected: bool, timeout_s: float | None) -> bool:
    """All-reduce MAX of every rank's verdict; True when any rank rejected the sync."""
    verdict = torch.tensor([1 if rejected else 0], dtype=torch.int64, device=group.device)
    group.all_reduce(verdict, "max", timeout_s)
    return bool(verdict.item())


# ------------------------------------------------------------------------------------------------
# Sender
# ------------------------------------------------------------------------------------------------
class WeightSender:
    """Broadcasts full tensors from rank ``src`` of ``group`` to every other rank.

    ``send`` walks ``(name, full tensor)`` pairs once (e.g. from a train backend's
    ``iter_full_tensor_buckets``), packing them into dtype-homogeneous buckets of ``bucket_bytes``.
    Double buffered: bucket ``i + 1`` is packed and checksummed while bucket ``i`` is on the wire
    (two staging buffers of ``bucket_bytes``).
    """

    def __init__(
        self,
        group: CommGroup,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        *,
        src: int = 0,
        timeout_s: float | None = None,
    ) -> None:
        if group.rank != src:
            raise ValueError(
                f"WeightSender must run on the source rank {src}, this is rank {group.rank}"
            )
        self.group = group
        self.src = src
        self.timeout_s = timeout_s
        self.packer = BucketPacker(bucket_bytes, group.device, num_staging=2)

    def _transmit(self, version: int, spec: BucketSpec, payload: torch.Tensor) -> list[PendingOp]:
        """Send one bucket's header (every receiver accepted it when this returns), then start
        sending its payload; the caller waits on the returned op."""
        _send_header(self.group, self.src, _bucket_header(version, spec), self.timeout_s)
        return [self.group.broadcast_async(payload, self.src, self.timeout_s)]

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> SyncMetrics:
        """Send one versioned sync; raises :class:`SyncError` if any receiver rejected it."""
        if not isinstance(version, int) or isinstance(version, bool):
            raise TypeError(f"version must be an int, got {type(version).__name__}")
        start = time.perf_counter()
        total_bytes = 0
        num_buckets = 0
        num_tensors = 0
        in_flight: list[PendingOp] = []
        # Resuming the packer packs (and checksums) the next bucket into the other staging buffer
        # while the previous bucket's broadcast is still in flight.
        for bucket in self.packer.pack(named_tensors):
            try:
                ops = self._transmit(version, bucket.spec, bucket.payload)
            finally:  # also when this bucket's header was refused: the previous one is delivered
                for op in in_flight:
                    op.wait()
            in_flight = ops
            total_bytes += bucket.spec.nbytes
            num_buckets += 1
            num_tensors += len(bucket.spec.tensors)
        for op in in_flight:
            op.wait()
        final = sealed(
            {
                "protocol": PROTOCOL,
                "version": version,
                "final": True,
                "num_buckets": num_buckets,
                "num_tensors": num_tensors,
                "bytes": total_bytes,
            }
        )
        _send_header(self.group, self.src, final, self.timeout_s)
        if _exchange_verdict(self.group, False, self.timeout_s):
            raise SyncError(
                f"weight sync version {version} ({num_buckets} buckets, {num_tensors} tensors) was "
                f"rejected by a receiver of group {self.group.name!r}; nothing was applied "
                "(the receiver's error names the bucket)"
            )
        return SyncMetrics.measure(
            total_bytes, time.perf_counter() - start, version, num_buckets, num_tensors
        )


# ------------------------------------------------------------------------------------------------
# Receiver
# ------------------------------------------------------------------------------------------------
class WeightReceiver:
    """Receives syncs sent by rank ``src``; verifies, then commits them through ``apply``.

    Versions must increase (a repeated or older version is rejected) unless ``expected_version``
    pins one. Received tensors are views into staging buffers owned by this receiver; ``apply``
    must copy what it keeps (engines copy into their parameters).
    """

    def __init__(
        self,
        group: CommGroup,
        *,
        src: int = 0,
        timeout_s: float | None = None,
        last_version: int | None = None,
    ) -> None:
        if group.rank == src:
            raise ValueError(f"WeightReceiver cannot run on the source rank {src}")
        self.group = group
        self.src = src
        self.timeout_s = timeout_s
        self.last_version = last_version
        self.incoming_version: int | None = None
        """Version of the sync being committed (set just before ``apply`` is called)."""

    def _version_problem(self, version: int, expected_version: int | None) -> str | None:
        if expected_version is not None and version != expected_version:
            return f"version {version} received but version {expected_version} was expected"
        if (
            expected_version is None
            and self.last_version is not None
            and version <= self.last_version
        ):
            return (
                f"stale version {version}: this receiver already holds version {self.last_version}"
            )
        return None

    def receive(self, apply: ApplyFn, *, expected_version: int | None = None) -> SyncMetrics:
        """Receive one sync; ``apply(named_tensors)`` is called once, only if all of it verified.

        Raises :class:`ChecksumError` (a payload or a header's digest does not match) /
        :class:`VersionError` / :class:`SyncError` (after draining the rest of the sync so the
        group stays usable); nothing is applied in that case.
        Pipelined: bucket ``i`` is verified and unpacked while bucket ``i + 1`` arrives.
        """
        start = time.perf_counter()
        staged: NamedTensors = []
        problems: list[str] = []
        error_type: type[SyncError] = SyncError
        version: int | None = None
        total_bytes = 0
        num_buckets = 0
        expected_index = 0
        arrived: tuple[BucketSpec, torch.Tensor] | None = None  # received, not yet verified

        def reject(problem: str, kind: type[SyncError] = SyncError) -> None:
            """Record a problem; the first one decides the error type raised."""
            nonlocal error_type
            if not problems:
                error_type = kind
            problems.append(problem)

        def verify_and_stage(spec: BucketSpec, payload: torch.Tensor) -> None:
            nonlocal expected_index
            if problems:
                return  # drain the rest of a rejected sync without staging it
            if spec.index != expected_index:
                reject(f"{spec.describe()} arrived where bucket {expected_index} was due")
                return
            expected_index += 1
            actual = checksum(payload)
            if actual != spec.checksum:
                reject(
                    f"checksum mismatch in {spec.describe(limit=20)} of version {version}: "
                    f"computed {actual:#018x}, sender sent {spec.checksum:#018x}",
                    ChecksumError,
                )
                return
            try:
                staged.extend(unpack(spec, payload))
            except ValueError as exc:
                reject(str(exc))

        while True:
            # a header failing its digest or its fields is refused on the spot, on every rank
            # (`_recv_header`): its sizes cannot be trusted to drain the rest of the sync
            header = _recv_header(
                self.group, self.src, self.timeout_s, partial(_bucket_header_problem, num_buckets)
            )
            header_version: int = header["version"]  # an int: checked by the header verdict
            if version is None:
                version = header_version
                problem = self._version_problem(version, expected_version)
                if problem:
                    reject(problem, VersionError)
            elif header_version != version:
                reject(
                    f"bucket header carries version {header_version} within sync of version "
                    f"{version}",
                    VersionError,
                )
            if header.get("final"):
                if arrived is not None:
                    verify_and_stage(*arrived)
                    arrived = None
                if not problems and (header.get("num_buckets"), header.get("bytes")) != (
                    num_buckets,
                    total_bytes,
                ):
                    reject(
                        f"sync ended after {num_buckets} buckets / {total_bytes} bytes, sender says "
                        f"{header.get('num_buckets')} / {header.get('bytes')}"
                    )
                break
            spec = _spec_from_header(header)
            payload = torch.empty(spec.nbytes, dtype=torch.uint8, device=self.group.device)
            receiving = self.group.broadcast_async(payload, self.src, self.timeout_s)
            if arrived is not None:  # verify the previous bucket while this one arrives
                verify_and_stage(*arrived)
            receiving.wait()
            arrived = (spec, payload)
            total_bytes += spec.nbytes
            num_buckets += 1
        assert version is not None
        rejected_elsewhere = _exchange_verdict(self.group, bool(problems), self.timeout_s)
        if problems:
            raise error_type(
                f"weight sync version {version} rejected by rank {self.group.rank} of group "
                f"{self.group.name!r}; nothing applied: " + "; ".join(problems)
            )
        if rejected_elsewhere:
            raise SyncError(
                f"weight sync version {version} was rejected by another receiver of group "
                f"{self.group.name!r}; nothing applied here either"
            )
        self.incoming_version = version
        apply(staged)
        self.last_version = version
        return SyncMetrics.measure(
            total_bytes, time.perf_counter() - start, version, num_buckets, len(staged)
        )


class _Committing(Protocol):
    """A receiver (`WeightReceiver`, `rl_sync.ipc.IpcReceiver`) while it commits a sync."""

    incoming_version: int | None


def engine_apply(engine: Any, receiver: _Committing) -> ApplyFn:
    """An ``apply`` callback committing into an rl_rollout engine, for a `WeightReceiver` or an
    `rl_sync.ipc.IpcReceiver`.

    Calls ``engine.update_weights(named_tensors, version)`` with the version of the sync being
    committed; the receiver's ``last_version`` only advances if the engine accepted it.
    """

    def apply(named_tensors: NamedTensors) -> None:
        engine.update_weights(named_tensors, receiver.incoming_version)

    return apply


def receive_into_engine(
    receiver: WeightReceiver, engine: Any, *, expected_version: int | None = None
) -> SyncMetrics:
    """Receive one sync and commit it with ``engine.update_weights(named_tensors, version)``."""
    return receiver.receive(engine_apply(engine, receiver), expected_version=expected_version)


def send_from_backend(sender: WeightSender, backend: Any, version: int) -> SyncMetrics:
    """Send a train backend's weights (``backend.iter_full_tensor_buckets``) as one sync."""

    def named() -> Iterable[tuple[str, torch.Tensor]]:
        for bucket in backend.iter_full_tensor_buckets(sender.packer.bucket_bytes):
            yield from bucket

    return sender.send(named(), version)


__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "MAX_HEADER_BYTES",
    "ChecksumError",
    "SyncError",
    "SyncMetrics",
    "VersionError",
    "WeightReceiver",
    "WeightSender",
    "engine_apply",
    "receive_into_engine",
    "send_from_backend",
]
