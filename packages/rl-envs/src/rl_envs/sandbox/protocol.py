"""Length-prefixed JSON frames between the pool and its workers (never pickle: a worker that
has run untrusted code must not be able to make the caller execute anything)."""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 256 * 1024 * 1024


class FrameTimeout(TimeoutError):
    """No whole frame arrived before the deadline."""


def write_frame(fd: int, obj: Any) -> None:
    payload = json.dumps(obj, allow_nan=True).encode()
    data = HEADER.pack(len(payload)) + payload
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exact(fd: int, size: int, deadline: float | None) -> bytes | None:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise FrameTimeout("frame deadline passed")
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                raise FrameTimeout("frame deadline passed")
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None, max_bytes: int = MAX_FRAME_BYTES) -> Any:
    """Next frame as a JSON value; None on EOF; ``FrameTimeout`` past ``deadline``;
    ``ValueError`` for a frame over ``max_bytes`` (before reading it)."""
    header = _read_exact(fd, HEADER.size, deadline)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > max_bytes:
        raise ValueError(f"frame of {size} bytes exceeds {max_bytes}")
    payload = _read_exact(fd, size, deadline)
    if payload is None:
        return None
    return json.loads(payload)
