"""The process of one sandboxed call, forked for the worker (``rl_envs.sandbox._worker``) by
its zygote (``rl_envs.sandbox.zygote``), a process that never held a task.

The zygote forks it, where permitted straight into new mount and pid namespaces (it is
pid 1 there: when it exits the kernel kills everything else it started). ``call_body`` gives it
its own process group, makes it die with the worker, reads its task from its own pipe, joins the
worker's control group, then ``run_body`` sets up
the private mounts and rlimits, drops to the slot's uid (root) or drops every capability (user
namespace), and runs the untrusted code. stdout/stderr go to a pipe the worker opened before the
fork and the JSON result to another: the worker never opens a path the call could have replaced
(a symlink to ``/etc/shadow`` in the work dir reads nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import os
import resource
import runpy
import signal
import sys
import traceback
from typing import Any

from rl_envs.sandbox import isolation, seccomp, spawner
from rl_envs.sandbox.cgroups import SlotCgroup
from rl_envs.sandbox.protocol import read_frame

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
#: the task's parts that carry data (arguments, sources), sent after the call is set up
PAYLOAD_KEYS = ("args", "kwargs", "calls", "source")
MAX_PAYLOAD_BYTES = 256 << 20


def _resolve(target: str) -> Any:
    module_name, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _json_default(value: Any) -> Any:
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"result of type {type(value).__name__} is not JSON serialisable")


def _die_with_parent() -> None:
    isolation._libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _set_limits(limits: dict[str, Any], baseline_vm: int) -> None:
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    address_space = baseline_vm + int(limits["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    fsize = int(limits["max_output_bytes"]) + 1
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    nproc = int(limits["max_processes"])
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _drop_privileges(uid: int) -> None:
    isolation.drop_bounding_capabilities()
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise RuntimeError("could not drop privileges")
    isolation.drop_capabilities()


def _block_python_sockets() -> None:
    """The weak mode's only network barrier (accepted only with ``allow_weak_isolation``):
    bypassed by ``socket.SocketType``, ctypes or any subprocess."""
    import socket

    _LOOPS.append(asyncio.new_event_loop())  # its self-pipe needs socketpair

    def _refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise PermissionError("network access is disabled in the sandbox")

    socket.socket = _refuse  # type: ignore[assignment,misc]
    socket.create_connection = _refuse  # type: ignore[assignment]
    socket.socketpair = _refuse  # type: ignore[assignment]
    socket.getaddrinfo = _refuse  # type: ignore[assignment]


_LOOPS: list[asyncio.AbstractEventLoop] = []  # made before sockets are patched (weak mode)


def _awaited(value: Any) -> Any:
    """The result of an ``async def`` function: its coroutine run to completion here."""
    if not inspect.iscoroutine(value):
        return value
    loop = _LOOPS[0] if _LOOPS else asyncio.new_event_loop()
    return loop.run_until_complete(value)


def _error_text(exc: BaseException) -> str:
    """``Type: message`` of a call's exception; an import that failed where this uid cannot
    read part of ``sys.path`` (a slot uid, Python installed under a private home) says so:
    only what the worker preloaded imports there."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ImportError):
        stdlib = os.path.dirname(os.__file__)
        hidden = [p for p in (stdlib, *sys.path) if p and os.path.isabs(p) and _unreadable(p)]
        if hidden:
            text += (
                f" (uid {os.getuid()}, which runs the call, cannot read {hidden[0]} "
                "(on sys.path): only the modules the worker preloaded import from there; add them "
                "to SandboxPool(preload=...), or install Python where other users can read it)"
            )
    return text[:2000]


def _unreadable(path: str) -> bool:
    """``path`` exists (for the worker) but this process may not search it."""
    try:
        os.stat(path)
    except PermissionError:
        return True
    except OSError:
        return False
    return not os.access(path, os.R_OK | os.X_OK)


def _call_one(target: Any, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """One call of a ``call_each`` batch: its value, or its exception as a failed outcome (the
    batch goes on). Anything that is not an ``Exception`` ends the batch."""
    try:
        return {"ok": True, "value": _awaited(target(*args, **kwargs))}
    except Exception as exc:
        kind_name = "memory" if isinstance(exc, MemoryError) else "exception"
        return {"ok": False, "kind": kind_name, "error": _error_text(exc)}


def _execute(task: dict[str, Any], target: Any, workdir: str) -> Any:
    args = task.get("args", [])
    kwargs = task.get("kwargs", {})
    kind = task["kind"]
    if kind == "call":
        return _awaited(target(*args, **kwargs))
    if kind == "call_each":
        return [
            _call_one(target, call_args, call_kwargs) for call_args, call_kwargs in task["calls"]
        ]
    if kind == "source":
        path = os.path.join(workdir, task.get("filename") or "reward_fn.py")
        with open(path, "w") as handle:
            handle.write(task["source"])
        namespace = runpy.run_path(path, run_name="rl_envs_sandboxed_module")
        fn = namespace.get(task["function"])
        if not callable(fn):
            raise AttributeError(f"{task.get('filename')} defines no function {task['function']!r}")
        return _awaited(fn(*args, **kwargs))
    if kind == "python":
        path = os.path.join(workdir, "main.py")
        with open(path, "w") as handle:
            handle.write(task["source"])
        runpy.run_path(path, run_name="__main__")
        return None
    raise ValueError(f"unknown task kind {kind!r}")


def run_body(
    task: dict[str, Any], call: dict[str, Any], result_fd: int, output_fd: int, payload_fd: int
) -> None:
    """The untrusted call itself (pid 1 of its namespaces where they exist): ``task`` is its
    header (kind, target, limits); its arguments and source come from ``payload_fd`` once the
    sandbox is set up (and a grader's candidate spawner forked). Never returns."""
    me = os.getpid()
    status = 0
    try:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        limits = task["limits"]
        trusted = task["kind"] in ("call", "call_each")
        target = _resolve(task["target"]) if trusted else None  # trusted, first
        workdir = call["workdir"]
        if call["namespaces"]:
            owner = call["uid"] if call["uid"] is not None else os.geteuid()
            isolation.private_mounts(int(limits["tmp_mb"]) << 20, owner, owner, call["hidden"])
            os.makedirs(workdir, exist_ok=True)
        _set_limits(limits, call["baseline_vm"])
        if call["uid"] is not None:
            _drop_privileges(call["uid"])
            _die_with_parent()  # a change of credentials clears the parent-death signal
        elif os.geteuid() == 0:  # uid 0 of a user namespace: keep the uid, lose every capability
            isolation.drop_bounding_capabilities()
            isolation.drop_capabilities()
        else:  # the caller's uid: its supplementary groups go where the kernel lets them
            with contextlib.suppress(PermissionError):
                os.setgroups([])
        # the trainer's session keyring came with the fork
        isolation.leave_callers_keyrings(own_uid=call["uid"] is not None)
        os.chdir(workdir)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        os.close(output_fd)
        if call["block_sockets"]:
            _block_python_sockets()
        if call["seccomp"]:  # last: no socket of any family from here on (fails closed)
            seccomp.install()
            seccomp.explain_python_sockets()
        entry = getattr(target, spawner.ENTRY_ATTRIBUTE, None)
        if entry is not None:  # before the arguments arrive: candidates never see them
            spawner.start(entry)
        arguments = read_frame(payload_fd, None, MAX_PAYLOAD_BYTES)
        os.close(payload_fd)
        if not isinstance(arguments, dict):
            raise RuntimeError("the call's arguments never arrived")
        payload = {"ok": True, "value": _execute({**task, **arguments}, target, workdir)}
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        payload = {"ok": code == 0, "value": None, "kind": "ok" if code == 0 else "exit",
                   "error": f"SystemExit({exc.code!r})"}  # fmt: skip
    except BaseException as exc:
        kind_name = "memory" if isinstance(exc, MemoryError) else "exception"
        tb = traceback.format_exc(limit=8)
        payload = {"ok": False, "value": None, "kind": kind_name,
                   "error": _error_text(exc), "traceback": tb[-4000:]}  # fmt: skip
    if os.getpid() != me:  # a process the call forked fell through to here
        os._exit(0)
    try:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        try:
            data = json.dumps(payload, default=_json_default, allow_nan=True).encode()
        except (TypeError, ValueError) as exc:
            data = json.dumps({"ok": False, "kind": "bad_result", "error": str(exc)[:500]}).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(result_fd, view) :]
    except BaseException:
        status = 3
    os._exit(status)


def call_body(fds: list[int], call: dict[str, Any], cgroup: SlotCgroup | None,
              close_fds: list[int]) -> None:  # fmt: skip
    """The call process, just forked by the zygote (``rl_envs.sandbox.zygote``): ``fds`` are
    its result, output and task pipes. Reads its task's header (and work dir) only now, its
    arguments later (``run_body``). Never returns."""
    result_fd, output_fd, task_fd = fds
    try:
        os.setpgid(0, 0)
        _die_with_parent()
        # the worker is not dumpable; the call sets up its mounts through /proc/self (a uid
        # change, as root, makes it undumpable again)
        isolation._libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        for fd in close_fds:
            os.close(fd)
        message = read_frame(task_fd)
        if message is None:
            os._exit(71)
        if cgroup is not None:
            cgroup.enter()
        header = {**call, "workdir": message["workdir"]}
        run_body(message["task"], header, result_fd, output_fd, task_fd)
    finally:
        os._exit(70)


__all__ = ["PAYLOAD_KEYS", "call_body", "run_body"]
