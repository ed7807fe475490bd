"""In-process workers (`--no-ray`) whose calls can be waited on with a timeout.

A `LocalWorker` builds its object and runs every method call on one daemon thread of its own, in
submission order, and returns `concurrent.futures.Future`s; `rl_runtime.cluster.rpc.call` waits on them
with the group's `rpc_timeout`, exactly as on Ray object refs. One thread per worker keeps
thread-bound state (the current CUDA device, torch's per-thread settings) across calls. A call
that hangs cannot be killed inside the process, but the driver stops waiting, raises
`RpcTimeoutError` naming the role and method, and the daemon thread does not hold the exit.

Stopping releases the object on its own thread, and `join` waits for that: the driver must not
exit while a daemon thread still runs torch. Python (before 3.14) ends a daemon thread that wakes
during interpreter exit with `pthread_exit`, whose unwinding through torch's C++ frames aborts the
whole process ("terminate called without an active exception", rc -6) after the run succeeded.
A worker's object torn down on its thread as the driver exits (an FSDP2 model's process group,
whose destructor releases the GIL) is the likely cause of the one such abort seen in CI.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

_STOP = object()


class LocalWorker:
    """`cls(**kwargs)` on a dedicated daemon thread; `submit(method, ...)` -> Future."""

    def __init__(self, cls: type, kwargs: dict[str, Any], *, name: str) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._obj: Any = None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()
        self.constructed = self._put(lambda: self._construct(cls, kwargs))

    def _construct(self, cls: type, kwargs: dict[str, Any]) -> None:
        self._obj = cls(**kwargs)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not _STOP:
            future, fn = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the waiting driver
                future.set_exception(exc)
            del job, future, fn  # nothing of a finished call outlives it on this thread
        self._obj = None  # its destructors run here, before `join` returns (module docstring)

    def _put(self, fn: Callable[[], Any]) -> Future:
        future: Future = Future()
        self._jobs.put((future, fn))
        return future

    def submit(
        self, method: str, args: tuple = (), kwargs: dict | None = None, *, optional: bool = False
    ) -> Future:
        """Run `obj.method(*args, **kwargs)` on the worker's thread after the calls before it.
        `optional`: an object without `method` (or never constructed) gives None."""

        def run() -> Any:
            if self._obj is None:
                if optional:
                    return None
                self.constructed.result()  # the constructor raised: every call reports that
            if optional and not hasattr(self._obj, method):
                return None
            return getattr(self._obj, method)(*args, **(kwargs or {}))

        return self._put(run)

    def stop(self) -> None:
        """Let the thread end after the calls already submitted, releasing the object there
        (does not wait: `join` does)."""
        self._jobs.put(_STOP)

    def join(self, timeout_s: float) -> bool:
        """Wait at most `timeout_s` for the thread to end after `stop`; True if it has."""
        self._thread.join(timeout=max(0.0, timeout_s))
        return not self._thread.is_alive()
