"""Sandbox worker process: ``python -m rl_envs.sandbox._worker`` (started by ``SandboxPool``).

The worker is trusted code. For each task it forks a CALL process that: gets its own process
group, dies with the worker (PDEATHSIG), redirects stdout/stderr to a size-capped file, sets
RLIMIT_CPU/AS/FSIZE/NPROC/CORE, drops to ``sandbox_uid`` when root (so RLIMIT_NPROC applies),
works in a private temp dir, and writes its JSON result to a pipe. The worker enforces the wall
timeout, kills the call's process group and every descendant that escaped it (the worker is a
child subreaper, so orphans come back to it), and reaps them all.

The worker itself lives in an empty network namespace when that is permitted.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import resource
import runpy
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
from typing import Any

from rl_envs.sandbox.protocol import read_frame, write_frame

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
OUTPUT_FILE = ".sandbox_output"

# Modules imported by the worker before any call so that a call running as an unprivileged user
# (which may not read the interpreter's files) can still use them.
DEFAULT_PRELOAD = (
    "abc", "ast", "base64", "bisect", "calendar", "cmath", "collections", "collections.abc",
    "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "enum", "fractions",
    "functools", "hashlib", "heapq", "io", "itertools", "json", "math", "numbers", "operator",
    "random", "re", "statistics", "string", "textwrap", "typing", "unicodedata", "numpy",
    "pkgutil", "importlib.machinery", "importlib.util", "linecache", "tokenize", "traceback",
    "socket", "struct", "array", "glob", "pathlib", "pprint", "time", "warnings", "weakref",
    "encodings.idna", "encodings.ascii", "encodings.latin_1",
)  # fmt: skip

_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> bool:
    return _libc.prctl(option, value, 0, 0, 0) == 0


def _isolate_network() -> str:
    """Put the worker in an empty network namespace; returns how network is cut off."""
    if _libc.unshare(CLONE_NEWNET) == 0:
        return "netns"
    if os.geteuid() != 0 and _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return "userns+netns"
    return "python-socket-block"


def _block_python_sockets() -> None:
    import socket

    def _refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise PermissionError("network access is disabled in the sandbox")

    socket.socket = _refuse  # type: ignore[assignment,misc]
    socket.create_connection = _refuse  # type: ignore[assignment]
    socket.socketpair = _refuse  # type: ignore[assignment]
    socket.getaddrinfo = _refuse  # type: ignore[assignment]
    _socket = sys.modules.get("_socket")
    if _socket is not None:
        _socket.socket = _refuse  # type: ignore[attr-defined]


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
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise RuntimeError("could not drop privileges")


def _call_process(
    task: dict[str, Any], state: dict[str, Any], result_fd: int, workdir: str
) -> None:
    """Body of the forked call process. Never returns."""
    me = os.getpid()
    status = 0
    try:
        os.setpgid(0, 0)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        for fd in (state["proto_in"], state["proto_out"]):
            os.close(fd)
        limits = task["limits"]
        kind = task["kind"]
        target = _resolve(task["target"]) if kind == "call" else None  # trusted: before the drop
        _set_limits(limits, state["baseline_vm"])
        if state["root"] and limits["drop_privileges"]:
            _drop_privileges(int(limits["sandbox_uid"]))
        os.chdir(workdir)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        out = os.open(OUTPUT_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        if not limits["network"] and state["network"] == "python-socket-block":
            _block_python_sockets()
        args = task.get("args", [])
        kwargs = task.get("kwargs", {})
        if kind == "call":
            assert target is not None
            value = target(*args, **kwargs)
        elif kind == "source":
            path = os.path.join(workdir, task.get("filename") or "reward_fn.py")
            with open(path, "w") as handle:
                handle.write(task["source"])
            namespace = runpy.run_path(path, run_name="rl_envs_sandboxed_module")
            fn = namespace.get(task["function"])
            if not callable(fn):
                raise AttributeError(
                    f"{task.get('filename')} defines no function {task['function']!r}"
                )
            value = fn(*args, **kwargs)
        elif kind == "python":
            path = os.path.join(workdir, "main.py")
            with open(path, "w") as handle:
                handle.write(task["source"])
            runpy.run_path(path, run_name="__main__")
            value = None
        else:
            raise ValueError(f"unknown task kind {kind!r}")
        payload = {"ok": True, "value": value}
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        payload = {"ok": code == 0, "value": None, "kind": "ok" if code == 0 else "exit",
                   "error": f"SystemExit({exc.code!r})"}  # fmt: skip
    except BaseException as exc:
        kind_name = "memory" if isinstance(exc, MemoryError) else "exception"
        tb = traceback.format_exc(limit=8)
        payload = {"ok": False, "value": None, "kind": kind_name,
                   "error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": tb[-4000:]}  # fmt: skip
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


def _children() -> list[int]:
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(p) for p in handle.read().split()]
    except OSError:
        return []


def _reap_all(call_pid: int) -> None:
    """Kill the call's process group and every other descendant, then reap them."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(call_pid, signal.SIGKILL)
    for _ in range(2000):
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                break
        kids = _children()
        if not kids:
            return
        for kid in kids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(kid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(kid, signal.SIGKILL)
        time.sleep(0.001)


def _drain(fd: int, chunks: list[bytes]) -> bool:
    """Read what is available without blocking; True at end of file."""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return False
        if not chunk:
            return True
        chunks.append(chunk)


def _run_task(task: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    limits = task["limits"]
    if task["kind"] == "call":
        # trusted module: import it once in the worker so calls do not pay for it after the fork
        try:
            importlib.import_module(task["target"].partition(":")[0])
        except Exception as exc:
            return {
                "ok": False,
                "kind": "exception",
                "error": f"cannot import target: {exc!r}"[:2000],
            }
    cap = int(limits["max_output_bytes"])
    workdir = tempfile.mkdtemp(prefix="rl_sandbox_")
    if state["root"] and limits["drop_privileges"]:
        os.chown(workdir, int(limits["sandbox_uid"]), int(limits["sandbox_uid"]))
    read_fd, write_fd = os.pipe()
    start = time.monotonic()
    deadline = start + float(limits["timeout_s"])
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            _call_process(task, state, write_fd, workdir)
        finally:
            os._exit(70)
    os.close(write_fd)
    pidfd = None
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(pid)
    chunks: list[bytes] = []
    size = 0
    outcome = ""
    status: int | None = None
    os.set_blocking(read_fd, False)
    eof = False
    try:
        # Finished when the call process has exited (descendants may hold the pipe open).
        while status is None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                outcome = "timeout"
                break
            watch = [read_fd] if not eof else []
            if pidfd is not None:
                watch.append(pidfd)
            else:
                wait = min(wait, 0.002)
            if watch:
                select.select(watch, [], [], wait)
            else:
                time.sleep(wait)
            eof = eof or _drain(read_fd, chunks)
            size = sum(len(c) for c in chunks)
            if size > cap + 4096:
                outcome = "output_too_large"
                break
            got, raw_status = os.waitpid(pid, os.WNOHANG)
            if got:
                status = raw_status
                _drain(read_fd, chunks)
                if sum(len(c) for c in chunks) > cap + 4096:
                    outcome = "output_too_large"
    finally:
        _reap_all(pid)
        if status is None:
            with contextlib.suppress(ChildProcessError):
                _, status = os.waitpid(pid, 0)
        os.close(read_fd)
        if pidfd is not None:
            os.close(pidfd)
    duration = time.monotonic() - start
    output_path = os.path.join(workdir, OUTPUT_FILE)
    output = b""
    output_size = 0
    with contextlib.suppress(OSError):
        output_size = os.path.getsize(output_path)
        with open(output_path, "rb") as handle:
            output = handle.read(min(cap, 64 * 1024))
    shutil.rmtree(workdir, ignore_errors=True)
    response: dict[str, Any] = {"duration_s": duration, "stdout": output.decode(errors="replace")}
    signal_number = os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None
    if outcome:
        response.update(ok=False, kind=outcome, error=f"call {outcome.replace('_', ' ')}")
    elif output_size > cap:
        response.update(ok=False, kind="output_too_large", error=f"output over {cap} bytes")
    elif not chunks:
        if signal_number == signal.SIGXCPU:
            response.update(ok=False, kind="cpu_limit", error="CPU time limit exceeded")
        elif signal_number is not None:
            name = signal.Signals(signal_number).name
            response.update(ok=False, kind="crashed", error=f"call killed by {name}")
        else:
            code = os.WEXITSTATUS(status) if status is not None else -1
            response.update(ok=False, kind="crashed", error=f"call exited with status {code}")
    else:
        response.update(ok=True, kind="ok", result_json=b"".join(chunks).decode(errors="replace"))
    return response


def _baseline_vm() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    sys.dont_write_bytecode = True
    proto_in = os.dup(0)
    proto_out = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    config = read_frame(proto_in)
    if config is None:
        return
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    network = "allowed" if config.get("network") else _isolate_network()
    errors = []
    for name in [*DEFAULT_PRELOAD, *config.get("preload", [])]:
        try:
            importlib.import_module(name)
        except Exception as exc:  # optional modules may be absent
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    for target in config.get("warmup", []):
        try:
            _resolve(target)()
        except Exception as exc:
            errors.append(f"warmup {target}: {type(exc).__name__}: {exc}")
    state = {
        "proto_in": proto_in,
        "proto_out": proto_out,
        "root": os.geteuid() == 0,
        "network": network,
        "baseline_vm": _baseline_vm(),
    }
    write_frame(proto_out, {"ready": True, "pid": os.getpid(), "network": network,
                            "root": state["root"], "preload_errors": errors})  # fmt: skip
    while True:
        task = read_frame(proto_in)
        if task is None:
            return
        try:
            response = _run_task(task, state)
        except Exception as exc:  # a bug here must not kill the worker silently
            response = {"ok": False, "kind": "worker_error", "error": repr(exc)[:2000]}
        write_frame(proto_out, response)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    main()
    sys.exit(0)

__all__ = ["DEFAULT_PRELOAD", "main"]
