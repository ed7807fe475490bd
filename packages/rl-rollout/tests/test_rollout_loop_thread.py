"""The engine loop thread bounds every wait: a coroutine that never finishes turns into an
EngineTimeoutError naming the operation (and is cancelled) instead of a hang. This is the loop
VLLMEngine runs AsyncLLM on, so its start, generate, weight update, sleep and abort are bounded."""

import asyncio
import time

import pytest

from rl_rollout.engine import EngineTimeoutError
from rl_rollout.loop_thread import LoopThread


@pytest.fixture
def runner():
    runner = LoopThread("test-engine", timeout_s=0.5)
    yield runner
    runner.stop()
    assert runner.closed


async def _forever(state: dict) -> None:
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        state["cancelled"] = True
        raise


async def _answer() -> int:
    await asyncio.sleep(0)
    return 42


def test_sync_call_returns_or_times_out_and_cancels(runner):
    assert runner.call(_answer(), "answer") == 42
    state: dict = {}
    start = time.monotonic()
    with pytest.raises(EngineTimeoutError, match=r"vLLM weight update did not finish within 0.5 s"):
        runner.call(_forever(state), "vLLM weight update")
    assert time.monotonic() - start < 5.0
    deadline = time.monotonic() + 5.0
    while "cancelled" not in state and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state == {"cancelled": True}


def test_wait_from_another_event_loop_is_bounded(runner):
    assert asyncio.run(runner.wait(runner.submit(_answer()), "answer")) == 42
    state: dict = {}
    with pytest.raises(EngineTimeoutError, match="generate of 2 did not finish within 0.2 s"):
        asyncio.run(runner.wait(runner.submit(_forever(state)), "generate of 2", timeout_s=0.2))
    with pytest.raises(ValueError, match="timeout_s"):
        LoopThread("bad", timeout_s=0)
