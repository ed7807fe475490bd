"""The clean process every call is forked from (trusted code).

A worker reads each task (arguments, ground truths, sources) into its own heap, and freed memory
is not wiped: a call forked from the worker could scan its memory for the arguments of earlier
calls. So right after its start-up (isolation, preloads, warm-up) and before it reads any task,
the worker forks a zygote, which never reads a task. For each call the worker hands the zygote
the call's pipes (``SCM_RIGHTS``); the zygote forks the call with ``CLONE_PARENT`` (the worker
is its parent: it waits for it, reads its rusage and kills it as before), in the call's
namespaces where there are any, and replies with its pid. The call reads its task from its own
pipe only after the fork. No call is forked from another call, a grader's included.

Messages on the control socket are one JSON line each way: ``{"op": "fork"}`` with the call's
descriptors (result, output, task) and ``{"op": "import", "module": name}`` (a trusted target's
module, imported once in the zygote so later calls start with it). Replies: ``{"pid": n}`` and
``{"error": text}``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
from collections.abc import Callable
from typing import Any

from rl_envs.sandbox import isolation

CLONE_PARENT = 0x00008000
PR_SET_PDEATHSIG = 1
MAX_MESSAGE = 1 << 16


class ZygoteLost(RuntimeError):
    """The zygote stopped answering: the worker cannot start calls any more."""


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode() + b"\n"
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.sendall(data)


def _receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 4)
    if not data:
        return None, fds
    return json.loads(data), fds


class Zygote:
    """The worker's handle on its zygote."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self._sock = sock
        self._imported: dict[str, str] = {}

    def _ask(self, message: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        try:
            _send(self._sock, message, fds)
            reply, extra = _receive(self._sock)
        except OSError as exc:
            raise ZygoteLost(f"sandbox zygote lost: {exc}") from exc
        for fd in extra:
            os.close(fd)
        if reply is None:
            raise ZygoteLost("sandbox zygote lost")
        return reply

    def import_module(self, name: str) -> str:
        """Import ``name`` in the zygote (once); "" or the import error."""
        if name not in self._imported:
            self._imported[name] = str(self._ask({"op": "import", "module": name}).get("error", ""))
        return self._imported[name]

    def fork_call(self, fds: list[int]) -> int:
        """A new call process (a child of the worker) holding ``fds`` (result, output, task)."""
        reply = self._ask({"op": "fork"}, fds)
        if "pid" not in reply:
            raise OSError(f"sandbox zygote could not fork a call: {reply.get('error')}")
        return int(reply["pid"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()


def _fork_call(namespaces: bool) -> int:
    flags = CLONE_PARENT | (isolation.CALL_NAMESPACES if namespaces else 0)
    return isolation.clone_fork(flags)


def _serve(sock: socket.socket, namespaces: bool, body: Callable[[list[int]], None]) -> None:
    while True:
        try:
            message, fds = _receive(sock)
        except (OSError, ValueError):
            return
        if message is None:
            return
        reply: dict[str, Any]
        if message.get("op") == "import":
            try:
                importlib.import_module(str(message["module"]))
                reply = {}
            except Exception as exc:
                reply = {"error": repr(exc)[:2000]}
        elif message.get("op") == "fork" and len(fds) == 3:
            try:
                pid = _fork_call(namespaces)
            except OSError as exc:
                reply = {"error": str(exc)}
            else:
                if pid == 0:
                    try:
                        sock.close()
                        body(fds)
                    finally:
                        os._exit(70)
                reply = {"pid": pid}
        else:
            reply = {"error": f"bad request {message!r}"[:500]}
        for fd in fds:
            os.close(fd)
        _send(sock, reply)


def start_zygote(
    namespaces: bool, close_fds: list[int], body: Callable[[list[int]], None]
) -> Zygote:
    """Fork the zygote. ``close_fds``: the worker's descriptors it must not hold (the pool's
    protocol pipes). ``body(fds)`` runs in each forked call process and never returns."""
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            parent_sock.close()
            for fd in close_fds:
                os.close(fd)
            isolation._libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            _serve(child_sock, namespaces, body)
        finally:
            os._exit(0)
    child_sock.close()
    return Zygote(pid, parent_sock)


__all__ = ["Zygote", "ZygoteLost", "start_zygote"]
