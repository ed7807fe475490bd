"""Resource limits of one sandboxed call."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class SandboxLimits:
    """Hard limits applied to every call.

    ``timeout_s``: wall clock; the call is killed (with everything it started) past it.
    ``cpu_s``: RLIMIT_CPU (default ``ceil(timeout_s) + 1``). ``memory_mb``: address space
    (RLIMIT_AS) allowed ABOVE the worker's baseline. ``max_processes``: RLIMIT_NPROC (enforced
    because the call runs as ``sandbox_uid`` when the pool runs as root). ``max_output_bytes``:
    cap on captured stdout/stderr (RLIMIT_FSIZE) and on the returned value's JSON.
    ``network``: False isolates the worker in an empty network namespace (or, where that is not
    permitted, blocks Python sockets in the call). ``drop_privileges``: run calls as
    ``sandbox_uid`` when root.
    """

    timeout_s: float = 5.0
    cpu_s: int | None = None
    memory_mb: int = 1024
    max_processes: int = 32
    max_output_bytes: int = 1 << 20
    network: bool = False
    drop_privileges: bool = True
    sandbox_uid: int = 65534

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        for name in ("memory_mb", "max_processes", "max_output_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def effective_cpu_s(self) -> int:
        return self.cpu_s if self.cpu_s is not None else math.ceil(self.timeout_s) + 1

    def with_timeout(self, timeout_s: float | None) -> SandboxLimits:
        return self if timeout_s is None else replace(self, timeout_s=timeout_s)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cpu_s"] = self.effective_cpu_s
        return data
