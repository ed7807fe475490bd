"""A private asyncio event loop on a daemon thread, with bounded waits on its coroutines.

Engines whose library is asyncio-native (vLLM's AsyncLLM) keep it on such a loop so they can be
used from any event loop and from synchronous code. Every wait on the loop has a deadline:
`call(coro, what)` raises `EngineTimeoutError` naming `what` after `timeout_s`, and cancels the
coroutine, instead of blocking its caller forever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from rl_rollout.engine import EngineTimeoutError

T = TypeVar("T")


class LoopThread:
    """An event loop running on its own daemon thread (see module docstring)."""

    def __init__(self, name: str, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T], what: str, timeout_s: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result at most `timeout_s` (default: the
        thread's); past it the coroutine is cancelled and EngineTimeoutError names `what`."""
        return self.result(self.submit(coro), what, timeout_s)

    def result(
        self, future: concurrent.futures.Future[T], what: str, timeout_s: float | None = None
    ) -> T:
        """Block until a `submit`ted future is done, at most `timeout_s` (then it is cancelled
        and EngineTimeoutError names `what`)."""
        seconds = self.timeout_s if timeout_s is None else timeout_s
        try:
            return future.result(timeout=seconds)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise EngineTimeoutError(f"{what} did not finish within {seconds:g} s") from exc

    async def wait(
        self, future: concurrent.futures.Future[T], what: str, timeout_s: float | None = None
    ) -> T:
        """Await a `submit`ted future from another event loop, at most `timeout_s`."""
        seconds = self.timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), seconds)
        except asyncio.TimeoutError as exc:  # not the builtin on Python 3.10
            future.cancel()
            raise EngineTimeoutError(f"{what} did not finish within {seconds:g} s") from exc

    @property
    def closed(self) -> bool:
        return self.loop.is_closed()

    def stop(self, join_timeout_s: float = 30.0) -> None:
        """Stop the loop, wait (bounded) for its thread, close it."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=join_timeout_s)
        if not self._thread.is_alive():
            self.loop.close()
