"""Bounded remote calls: every wait on a remote result has a timeout.

`call(refs, timeout=..., role=..., method=...)` is the only way the runtime waits on Ray work and
on in-process (`--no-ray`) workers' futures.
A timeout raises `RpcTimeoutError` naming the role and the method, so a hung worker is reported
as "actor_infer.generate did not answer within 600 s" instead of blocking forever.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Any


class RpcTimeoutError(TimeoutError):
    """A remote call did not finish within `rpc_timeout` seconds."""

    def __init__(self, role: str, method: str, timeout_s: float, pending: int) -> None:
        super().__init__(
            f"{role}.{method} did not answer within {timeout_s:g} s "
            f"({pending} call(s) pending); raise rpc_timeout in the config if the work is "
            f"legitimately slow, or check the worker's log for a hang"
        )
        self.role = role
        self.method = method
        self.timeout_s = timeout_s


class RemoteCallError(RuntimeError):
    """A remote call raised; the message names the role and method."""


def _is_ray_ref(obj: Any) -> bool:
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a declared dependency
        return False
    return isinstance(obj, ray.ObjectRef)


def call(
    refs: Any | Sequence[Any],
    *,
    timeout: float,
    role: str = "worker",
    method: str = "call",
) -> Any:
    """Wait for remote results with a deadline.

    `refs` is one Ray ObjectRef, a `concurrent.futures.Future` (local workers), a list of them,
    or already-computed values, which are returned unchanged. Returns one value for one ref, a
    list for a list. Raises `RpcTimeoutError` after `timeout` seconds, `RemoteCallError` (chained
    to the worker's exception) if a Ray method raised, and a local method's own exception.
    """
    if timeout <= 0:
        raise ValueError(f"rpc timeout must be > 0 seconds, got {timeout}")
    single = not isinstance(refs, list | tuple)
    items = [refs] if single else list(refs)
    ray_items = [r for r in items if _is_ray_ref(r)]
    resolved: dict[int, Any] = {}
    if ray_items:
        import ray

        _ready, pending = ray.wait(ray_items, num_returns=len(ray_items), timeout=timeout)
        if pending:
            for ref in pending:
                ray.cancel(ref, force=False)
            raise RpcTimeoutError(role, method, timeout, len(pending))
        try:
            values = ray.get(ray_items, timeout=timeout)
        except ray.exceptions.GetTimeoutError as exc:  # pragma: no cover - all refs ready
            raise RpcTimeoutError(role, method, timeout, len(ray_items)) from exc
        except ray.exceptions.RayError as exc:
            raise RemoteCallError(f"{role}.{method} failed remotely: {exc}") from exc
        for ref, value in zip(ray_items, values):
            resolved[id(ref)] = value
    futures = [r for r in items if isinstance(r, concurrent.futures.Future)]
    if futures:
        _done, not_done = concurrent.futures.wait(futures, timeout=timeout)
        if not_done:
            for future in not_done:
                future.cancel()  # queued calls are dropped; a running one cannot be stopped
            raise RpcTimeoutError(role, method, timeout, len(not_done))
        for future in futures:
            resolved[id(future)] = future.result()
    out = [resolved.get(id(r), r) for r in items]
    return out[0] if single else out
