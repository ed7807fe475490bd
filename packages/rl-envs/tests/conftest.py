"""Shared sandbox pools for the rl-envs tests (started once per session)."""

from __future__ import annotations

import pytest

from rl_envs.rewards import MATH_PRELOAD, MATH_WARMUP
from rl_envs.sandbox import SandboxLimits, SandboxPool


@pytest.fixture(scope="session")
def hostile_pool():
    pool = SandboxPool(
        1,
        limits=SandboxLimits(
            timeout_s=1.5, memory_mb=512, max_processes=32, max_output_bytes=1 << 20
        ),
    )
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def math_pool():
    pool = SandboxPool(
        2, limits=SandboxLimits(timeout_s=10.0), preload=MATH_PRELOAD, warmup=MATH_WARMUP
    )
    yield pool
    pool.close()
