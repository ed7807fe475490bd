"""Out-of-process execution of untrusted functions and code with hard limits."""

from rl_envs.sandbox.counting import CountingPool
from rl_envs.sandbox.limits import SandboxLimits
from rl_envs.sandbox.pool import SandboxPool, SandboxResult, WeakIsolationError

__all__ = ["CountingPool", "SandboxLimits", "SandboxPool", "SandboxResult", "WeakIsolationError"]
