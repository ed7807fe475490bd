"""One lazily started pool per process for envs that grade answers (closed at exit)."""

from __future__ import annotations

import atexit
import threading

from rl_envs.sandbox.limits import SandboxLimits
from rl_envs.sandbox.pool import SandboxPool

_lock = threading.Lock()
_pool: SandboxPool | None = None
_allow_weak_isolation = False


def configure_shared_pool(*, allow_weak_isolation: bool) -> None:
    """Set before the first grading call (the runtime passes the config key
    ``sandbox_allow_weak_isolation``); changing it once the pool runs is an error."""
    global _allow_weak_isolation
    with _lock:
        if _pool is not None and _pool.limits.allow_weak_isolation != allow_weak_isolation:
            raise RuntimeError(
                "the shared sandbox pool is already running with "
                f"allow_weak_isolation={_pool.limits.allow_weak_isolation}"
            )
        _allow_weak_isolation = allow_weak_isolation


def shared_pool(num_workers: int = 2) -> SandboxPool:
    """The process-wide grading pool (math-verify preloaded)."""
    global _pool
    with _lock:
        if _pool is None:
            from rl_envs.rewards import MATH_PRELOAD, MATH_WARMUP

            _pool = SandboxPool(
                num_workers,
                limits=SandboxLimits(timeout_s=10.0, allow_weak_isolation=_allow_weak_isolation),
                preload=MATH_PRELOAD,
                warmup=MATH_WARMUP,
            )
            atexit.register(_pool.close)
        return _pool
