"""One lazily started pool per process for envs that grade answers (closed at exit)."""

from __future__ import annotations

import atexit
import threading

from rl_envs.sandbox.limits import SandboxLimits
from rl_envs.sandbox.pool import SandboxPool

_lock = threading.Lock()
_pool: SandboxPool | None = None


def shared_pool(num_workers: int = 2) -> SandboxPool:
    """The process-wide grading pool (math-verify preloaded)."""
    global _pool
    with _lock:
        if _pool is None:
            from rl_envs.rewards import MATH_PRELOAD, MATH_WARMUP

            _pool = SandboxPool(
                num_workers,
                limits=SandboxLimits(timeout_s=10.0),
                preload=MATH_PRELOAD,
                warmup=MATH_WARMUP,
            )
            atexit.register(_pool.close)
        return _pool
