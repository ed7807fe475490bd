"""Shared sandbox pools for the rl-envs tests (started once per session). They accept weak
isolation so that limit and timeout tests also run where namespaces are refused; the escape
tests read ``pool.isolation`` and skip, naming what is missing, where it is weak."""

from __future__ import annotations

import pytest

from rl_envs.rewards import MATH_PRELOAD, MATH_WARMUP
from rl_envs.sandbox import SandboxLimits, SandboxPool


@pytest.fixture(scope="session")
def hostile_pool():
    pool = SandboxPool(
        1,
        limits=SandboxLimits(
            timeout_s=1.5,
            memory_mb=512,
            max_processes=32,
            max_output_bytes=1 << 20,
            allow_weak_isolation=True,
        ),
    )
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def math_pool():
    pool = SandboxPool(
        2,
        limits=SandboxLimits(timeout_s=10.0, allow_weak_isolation=True),
        preload=MATH_PRELOAD,
        warmup=MATH_WARMUP,
    )
    yield pool
    pool.close()
