"""Resource limits of one sandboxed call."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class SandboxLimits:
    """Hard limits applied to every call.

    ``timeout_s``: wall clock; the call is killed (with everything it started) past it.
    ``cpu_s``: RLIMIT_CPU per process (default ``ceil(timeout_s) + 1``). ``memory_mb``: the
    TOTAL memory of all the call's processes where a control group is available (cgroup v2, or
    v1 on hybrid hosts); in every case also RLIMIT_AS per process above the worker's baseline.
    ``max_processes``: tasks in the call's control group (total) and RLIMIT_NPROC (per uid;
    root ignores it, hence the uid drop). ``max_output_bytes``: cap on captured stdout/stderr
    and on the returned value's JSON (and RLIMIT_FSIZE on files it writes). ``tmp_mb``: size of
    the call's private ``/tmp`` (a tmpfs in its own mount namespace, gone after the call).
    ``network``: False runs calls in an empty network namespace. ``allow_weak_isolation``:
    without it a pool refuses to start where no network namespace can be made (Docker's default
    seccomp profile): the fallback that patches Python's ``socket`` is bypassed by
    ``socket.SocketType``, ctypes or any subprocess. ``uid_base``: when the pool runs as root,
    each worker (call slot) runs its calls under its own uid from ``uid_base`` up, claimed
    host-wide (``rl_envs.sandbox.uids``: slot ``i`` tries ``uid_base + i`` first), so calls
    cannot signal or read each other, write the caller's files or use up each other's
    RLIMIT_NPROC, even across pools and processes.
    """

    timeout_s: float = 5.0
    cpu_s: int | None = None
    memory_mb: int = 1024
    max_processes: int = 32
    max_output_bytes: int = 1 << 20
    tmp_mb: int = 64
    network: bool = False
    allow_weak_isolation: bool = False
    uid_base: int = 64000

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        for name in ("memory_mb", "max_processes", "max_output_bytes", "tmp_mb", "uid_base"):
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
