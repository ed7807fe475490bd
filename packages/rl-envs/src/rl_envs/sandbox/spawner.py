"""Clean child processes for a grading call (trusted code, inside the call's sandbox).

A grader that runs the code it grades (``code_sandbox``) must not share an address space, or a
fork of one, with its expected outputs and assertions: a child forked from the grader inherits
them. A target marks itself with ``@forks_candidates(entry)``; its call process then forks a
spawner after the sandbox is set up (limits, uid, seccomp) but BEFORE it reads the call's
arguments, and the grader asks the spawner (``spawn(fds)``) for each candidate process: the
spawner forks one and runs ``entry(*fds)`` in it. Candidates therefore descend from a process
that never held the tests; the grader talks to them only through the pipes it hands over, as
data. The call also makes itself non-dumpable, so a candidate of the same uid cannot open the
grader's ``/proc/<pid>/mem`` (``ptrace`` and ``process_vm_readv`` are refused by the seccomp
filter).
"""

from __future__ import annotations

import _socket
import ctypes
import json
import os
import signal
import socket
from collections.abc import Callable
from typing import Any

PR_SET_DUMPABLE = 4
PR_SET_PDEATHSIG = 1
ENTRY_ATTRIBUTE = "sandbox_candidate_entry"

_current: Spawner | None = None


def forks_candidates(entry: Callable[..., None]) -> Callable[[Any], Any]:
    """Decorator for a sandbox target whose call needs clean candidate processes; ``entry(*fds)``
    runs in each (it never returns)."""

    def mark(fn: Any) -> Any:
        setattr(fn, ENTRY_ATTRIBUTE, entry)
        return fn

    return mark


class Spawner:
    """The grader's handle on its spawner process."""

    def __init__(self, pid: int, sock: Any) -> None:
        self.pid = pid
        self._sock = sock

    def spawn(self, fds: list[int]) -> int:
        """A new candidate process holding ``fds``; returns its pid."""
        socket.send_fds(self._sock, [b"spawn"], fds)
        reply = self._sock.recv(64)
        if not reply:
            raise OSError("the candidate spawner is gone")
        return int(json.loads(reply))


def current() -> Spawner:
    """The spawner of this call; RuntimeError outside a sandbox call of a marked target."""
    if _current is None:
        raise RuntimeError(
            "no candidate spawner: this grader runs only as a SandboxPool call of a target "
            "marked with rl_envs.sandbox.spawner.forks_candidates"
        )
    return _current


def _serve(sock: Any, entry: Callable[..., None]) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # candidates are reaped by the kernel
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, 64, 4)
        except OSError:
            return
        if not data:
            return
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                entry(*fds)
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)
        sock.sendall(json.dumps(pid).encode())


def start(entry: Callable[..., None]) -> Spawner:
    """Fork the spawner (from the call process, before it reads its arguments) and make the
    call non-dumpable."""
    global _current
    # the C-level pair: the weak mode replaces Python's socket classes (``_block_python_sockets``)
    ours, theirs = _socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            _serve(theirs, entry)
        finally:
            os._exit(0)
    theirs.close()
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    _current = Spawner(pid, ours)
    return _current


__all__ = ["ENTRY_ATTRIBUTE", "Spawner", "current", "forks_candidates", "start"]
