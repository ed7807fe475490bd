"""Sandbox worker process: ``python -m rl_envs.sandbox._worker`` (started by ``SandboxPool``).

The worker is trusted code; it serves one call slot of the pool (its own uid when root, its
own control group). For each task its zygote (``rl_envs.sandbox.zygote``, forked before any
task was read) forks the call (``rl_envs.sandbox.call``) as the worker's child, with pipes opened
BEFORE the fork, one for stdout/stderr, one for the JSON result and one that carries the task
after the fork: nothing the call
leaves in a directory is ever opened by path. The worker enforces the wall timeout, kills the
call's control group, process group and every descendant that escaped them (the worker is a
child subreaper), and reaps them all.

At start the worker isolates itself (``rl_envs.sandbox.isolation``), probes which isolation a
call gets, and reports it in its ready frame (see ``SandboxPool.isolation``).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from rl_envs.sandbox import isolation, seccomp, sysv
from rl_envs.sandbox.call import PAYLOAD_KEYS, _resolve, call_body
from rl_envs.sandbox.cgroups import SlotCgroup, open_slot_cgroup
from rl_envs.sandbox.protocol import read_frame, write_frame
from rl_envs.sandbox.uids import claim_uid
from rl_envs.sandbox.zygote import Zygote, ZygoteLost, start_zygote

PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
OUTPUT_KEEP_BYTES = 64 * 1024  # of the call's stdout/stderr, returned to the caller
SHARED_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")

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


def _children() -> list[int]:
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(p) for p in handle.read().split()]
    except OSError:
        return []


def _reap_all(call_pid: int, keep: int) -> None:
    """Kill the call's process group and every other descendant but ``keep`` (the zygote),
    then reap them."""
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
        kids = [kid for kid in _children() if kid != keep]
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


def _cleanup_shared_tmp(uid: int) -> None:
    """Without a mount namespace: remove what the slot's uid left at the top of the shared
    temp dirs (only that uid's entries; ``rmtree`` does not follow symlinks)."""
    for base in SHARED_TMP_DIRS:
        with contextlib.suppress(OSError), os.scandir(base) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid != uid:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)


@dataclass
class _Collected:
    """What the worker gathered from one call."""

    outcome: str = ""  # "", "timeout" or "output_too_large"
    status: int | None = None  # wait status of the call process
    cpu_s: float = 0.0  # CPU time of the call process
    chunks: list[bytes] = field(default_factory=list)  # the JSON result
    output: bytes = b""  # the first OUTPUT_KEEP_BYTES of stdout/stderr
    output_size: int = 0


def _supervise(pid: int, deadline: float, result_fd: int, output_fd: int, cap: int) -> _Collected:
    """Collect the result and output pipes until the call process exits or the deadline
    passes."""
    pidfd = None
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(pid)
    chunks: list[bytes] = []
    output: list[bytes] = []
    output_size = 0
    outcome = ""
    status: int | None = None
    open_fds = {result_fd, output_fd}
    for fd in open_fds:
        os.set_blocking(fd, False)

    def drain() -> None:
        nonlocal output_size
        for fd in list(open_fds):
            sink = chunks if fd == result_fd else output
            fresh: list[bytes] = []
            if _drain(fd, fresh):
                open_fds.discard(fd)
            if fd == output_fd:
                for chunk in fresh:
                    kept = sum(len(c) for c in sink)
                    if kept < OUTPUT_KEEP_BYTES:
                        sink.append(chunk[: OUTPUT_KEEP_BYTES - kept])
                    output_size += len(chunk)
            else:
                sink.extend(fresh)

    cpu_s = 0.0
    try:
        # Finished when the call process has exited (descendants may hold the pipes open).
        while status is None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                outcome = "timeout"
                break
            watch = list(open_fds)
            if pidfd is not None:
                watch.append(pidfd)
            else:
                wait = min(wait, 0.002)
            if watch:
                select.select(watch, [], [], wait)
            else:
                time.sleep(wait)
            drain()
            if sum(len(c) for c in chunks) > cap + 4096 or output_size > cap:
                outcome = "output_too_large"
                break
            got, raw_status, usage = os.wait4(pid, os.WNOHANG)
            if got:
                status = raw_status
                cpu_s = usage.ru_utime + usage.ru_stime
                drain()
    finally:
        if pidfd is not None:
            os.close(pidfd)
    if not outcome and (sum(len(c) for c in chunks) > cap + 4096 or output_size > cap):
        outcome = "output_too_large"
    return _Collected(outcome, status, cpu_s, chunks, b"".join(output), output_size)


def _run_task(task: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    limits = task["limits"]
    zygote: Zygote = state["zygote"]
    if task["kind"] in ("call", "call_each"):
        # trusted module: import it once in the zygote so calls do not pay for it after the fork
        error = zygote.import_module(task["target"].partition(":")[0])
        if error:
            return {"ok": False, "kind": "exception", "error": f"cannot import target: {error}"}
    cap = int(limits["max_output_bytes"])
    uid = state["uid"]
    namespaces = state["namespaces"]
    workdir = "/tmp" if namespaces else tempfile.mkdtemp(prefix="rl_sandbox_")
    if not namespaces and uid is not None:
        os.chown(workdir, uid, uid)
    cgroup: SlotCgroup | None = state["cgroup"]
    oom_before = 0
    if cgroup is not None:
        cgroup.set_limits(int(limits["memory_mb"]) << 20, int(limits["max_processes"]) + 1)
        oom_before = cgroup.oom_kills()
    result_r, result_w = os.pipe()
    output_r, output_w = os.pipe()
    task_r, task_w = os.pipe()
    start = time.monotonic()
    try:
        pid = zygote.fork_call([result_w, output_w, task_r])
    finally:
        for fd in (result_w, output_w, task_r):
            os.close(fd)
    try:  # the call reads its task first thing; one that died before gets EPIPE here
        with contextlib.suppress(BrokenPipeError):
            header = {k: v for k, v in task.items() if k not in PAYLOAD_KEYS}
            write_frame(task_w, {"task": header, "workdir": workdir})
            write_frame(task_w, {k: v for k, v in task.items() if k in PAYLOAD_KEYS})
    finally:
        os.close(task_w)
    try:
        got = _supervise(pid, start + float(limits["timeout_s"]), result_r, output_r, cap)
    finally:
        if cgroup is not None:
            cgroup.kill_all()
        _reap_all(pid, zygote.pid)
        os.close(result_r)
        os.close(output_r)
    if got.status is None:
        with contextlib.suppress(ChildProcessError):
            _, got.status = os.waitpid(pid, 0)
    duration = time.monotonic() - start
    if namespaces:
        pass  # the private /tmp and SysV IPC went away with the call's namespaces
    else:
        shutil.rmtree(workdir, ignore_errors=True)
        if uid is not None:
            _cleanup_shared_tmp(uid)
            sysv.remove_left_by(uid)
    oom = cgroup is not None and cgroup.oom_kills() > oom_before
    response = _classify(got, oom, float(limits["cpu_s"]))
    response["duration_s"] = duration
    return response


def _classify(got: _Collected, oom: bool, cpu_limit_s: float) -> dict[str, Any]:
    status = got.status
    response: dict[str, Any] = {"stdout": got.output.decode(errors="replace"),
                                "output_bytes": got.output_size}  # fmt: skip
    signal_number = os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None
    # pid 1 of a pid namespace ignores SIGXCPU: the hard limit's SIGKILL ends it instead
    cpu_killed = signal_number == signal.SIGXCPU or (
        signal_number == signal.SIGKILL and got.cpu_s >= cpu_limit_s
    )
    if got.outcome:
        response.update(ok=False, kind=got.outcome, error=f"call {got.outcome.replace('_', ' ')}")
    elif not got.chunks and oom:
        response.update(ok=False, kind="memory", error="memory cap of the call's processes hit")
    elif not got.chunks:
        if cpu_killed:
            response.update(ok=False, kind="cpu_limit", error="CPU time limit exceeded")
        elif signal_number is not None:
            name = signal.Signals(signal_number).name
            response.update(ok=False, kind="crashed", error=f"call killed by {name}")
        else:
            code = os.WEXITSTATUS(status) if status is not None else -1
            response.update(ok=False, kind="crashed", error=f"call exited with status {code}")
    else:
        result_json = b"".join(got.chunks).decode(errors="replace")
        response.update(ok=True, kind="ok", result_json=result_json)
    return response


def _baseline_vm() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _probe_call_namespaces(hidden: list[str]) -> bool:
    """Can a call get its mount, pid and IPC namespaces and private mounts here? (A throwaway
    fork tries the same steps as a real call.)"""
    try:
        pid = isolation.fork_into_call_namespaces()
    except OSError:
        return False
    if pid == 0:
        try:
            isolation.private_mounts(64 << 10, os.geteuid(), os.getegid(), hidden)
            os._exit(0)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _probe_seccomp() -> str:
    """ "" if a call can install the socket filter here (a throwaway fork installs it and
    tries a socket), else why not."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read_fd)
            seccomp.install()
            try:
                socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
                os.write(write_fd, b"the filter let a socket through")
            except PermissionError:
                status = 0
        except BaseException as exc:
            with contextlib.suppress(BaseException):
                os.write(write_fd, str(exc).encode()[:500])
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as handle:
        why = handle.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return ""
    return why or f"probe ended with status {status}"


def _groups_after_drop(uid: int | None) -> str:
    """ "dropped" when a call has no supplementary groups (a slot uid: always; the caller's
    uid: where ``setgroups`` is allowed), else "kept" (inside an unprivileged user namespace
    the kernel forbids dropping them)."""
    if uid is not None:
        return "dropped"
    try:
        os.setgroups([])
    except PermissionError:
        return "dropped" if not _real_groups() else "kept"
    return "dropped"


def _real_groups() -> list[int]:
    """The supplementary groups this process holds (as the host sees them)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("Groups:"):
                return [int(g) for g in line.split()[1:]]
    return []


def _setup(config: dict[str, Any]) -> dict[str, Any]:
    """Isolate the worker; returns the per-call state and the isolation report."""
    limits = config["limits"]
    root = os.geteuid() == 0
    uid, uid_lock = None, None
    if root:  # a uid no other live slot on this host uses (rl_envs.sandbox.uids)
        uid, uid_lock = claim_uid(int(limits["uid_base"]), int(config.get("slot", 0)))
    cgroup = open_slot_cgroup(
        f"rl_sandbox.{os.getpid()}",
        int(limits["memory_mb"]) << 20,
        int(limits["max_processes"]) + 1,
    )  # before a user namespace makes the cgroup files foreign
    network = "allowed" if config.get("network") else isolation.isolate_network(root)
    hidden = [str(p) for p in config.get("hidden", [])]
    namespaces = network != "none" and _probe_call_namespaces(hidden)
    no_filter = _probe_seccomp()
    report = {
        "network": network,
        "uid": "per-slot" if uid is not None else "shared-with-caller",
        "sandbox_uid": uid,
        "limits": cgroup.version if cgroup is not None else "rlimit",
        "mounts": "private" if namespaces else "shared",
        "pids": "pidns" if namespaces else "shared",
        "ipc": "ipcns" if namespaces else ("removed-per-call" if uid is not None else "shared"),
        # the user's credentials (rl_envs.sandbox.credentials); a slot uid cannot open 0600 ones
        "credentials": "hidden" if namespaces else ("slot-uid" if uid is not None else "readable"),
        # every socket family refused by a seccomp filter (rl_envs.sandbox.seccomp)
        "sockets": "open" if no_filter else "seccomp",
        "groups": _groups_after_drop(uid),
    }
    if no_filter:
        report["sockets_error"] = no_filter
    state = {"uid": uid, "uid_lock": uid_lock, "cgroup": cgroup, "namespaces": namespaces,
             "block_sockets": network == "none", "hidden": hidden,
             "seccomp": not no_filter}  # fmt: skip
    return {"state": state, "isolation": report}


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
    setup = _setup(config)
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
    # it will hold every task it serves: a call of the same uid (no pid namespace) must not be
    # able to open its /proc/<pid>/mem (calls make themselves dumpable again: call_body)
    _prctl(PR_SET_DUMPABLE, 0)
    state = {**setup["state"], "baseline_vm": _baseline_vm()}
    cgroup = state["cgroup"]
    call = {key: state[key] for key in ("uid", "namespaces", "hidden", "baseline_vm",
                                        "block_sockets", "seccomp")}  # fmt: skip
    # a call could unlock the uid claim and hand its uid to another slot
    lock = [state["uid_lock"]] if state["uid_lock"] is not None else []
    state["zygote"] = start_zygote(
        state["namespaces"],
        [proto_in, proto_out],
        lambda fds: call_body(fds, call, cgroup, lock),
    )  # before any task is read: it never holds one
    write_frame(proto_out, {"ready": True, "pid": os.getpid(), "zygote": state["zygote"].pid,
                            "isolation": setup["isolation"],
                            "cgroup": [cgroup.version, *cgroup.dirs] if cgroup else [],
                            "preload_errors": errors})  # fmt: skip
    try:
        while True:
            task = read_frame(proto_in)
            if task is None:
                return
            try:
                response = _run_task(task, state)
            except ZygoteLost:
                return  # the pool replaces a worker that stops answering
            except Exception as exc:  # a bug here must not kill the worker silently
                response = {"ok": False, "kind": "worker_error", "error": repr(exc)[:2000]}
            write_frame(proto_out, response)
    finally:
        if cgroup is not None:
            cgroup.remove()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    main()
    sys.exit(0)

__all__ = ["DEFAULT_PRELOAD", "main"]
