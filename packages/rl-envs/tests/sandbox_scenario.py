"""A "trainer" process for the sandbox tests that must run under another identity (a non-root
uid, or root without CAP_SYS_ADMIN so that namespaces are refused as under Docker's default
seccomp profile). Run by ``test_envs_sandbox_escapes.py``:

    python sandbox_scenario.py WORKDIR SECRET

It owns ``WORKDIR/checkpoint.pt``, tries to start a strict pool (recording the refusal), then
a pool that accepts weak isolation, lets hostile calls attack it (files, signals, /proc, shared
temp dirs, a SysV shared-memory segment, its unix socket, vsock), and prints one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

from rl_envs.sandbox import SandboxLimits, SandboxPool, WeakIsolationError
from rl_envs.sandbox.credentials import hide_from_calls

ATTACK = """
import json, os, signal
out = {{}}
try:
    with open({checkpoint!r}, "w") as handle:
        handle.write("overwritten")
    out["checkpoint"] = "written"
except OSError as exc:
    out["checkpoint"] = type(exc).__name__
try:
    os.kill({trainer}, signal.SIGUSR1)
    out["signal"] = "sent"
except OSError as exc:
    out["signal"] = type(exc).__name__
try:
    with open("/proc/{trainer}/cmdline", "rb") as handle:
        out["cmdline"] = handle.read().decode(errors="replace")
except OSError as exc:
    out["cmdline"] = type(exc).__name__
with open("/tmp/left_by_call_{secret}", "w") as handle:
    handle.write("x")
try:
    with open("/dev/shm/left_by_call_{secret}", "w") as handle:
        handle.write("x")
    out["dev_shm"] = "written"
except OSError as exc:
    out["dev_shm"] = type(exc).__name__
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
out["sysv_shm"] = libc.shmget({shm_key}, 1 << 16, 0o1000 | 0o666)  # IPC_CREAT, world writable
import socket
try:  # the trainer's own unix socket (a user's service manager, a daemon's group socket)
    client = socket.SocketType(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect({sock!r})
    out["unix_socket"] = "connected"
except OSError as exc:
    out["unix_socket"] = type(exc).__name__
try:
    socket.SocketType(40, socket.SOCK_STREAM)  # AF_VSOCK: the host's port space
    out["vsock"] = "opened"
except OSError as exc:
    out["vsock"] = type(exc).__name__
try:  # the checkpoint key the trainer's config names (not a default location)
    out["config_key"] = open({key!r}).read()
except OSError as exc:
    out["config_key"] = type(exc).__name__
try:  # the worker holds the tasks it served
    open("/proc/{worker}/mem", "rb").close()
    out["worker_mem"] = "opened"
except OSError as exc:
    out["worker_mem"] = type(exc).__name__
out["groups"] = [line.split()[1:] for line in open("/proc/self/status") if line.startswith("Groups:")][0]
print(json.dumps(out))
"""


SCAN_MEMORY = r"""
import ctypes, re
found = set()
for line in open("/proc/self/maps").read().splitlines():
    fields = line.split()
    if not fields[1].startswith("r") or fields[-1] in ("[vvar]", "[vsyscall]", "[vvar_vclock]"):
        continue
    start, end = (int(x, 16) for x in fields[0].split("-"))
    try:
        data = ctypes.string_at(start, end - start)
    except Exception:
        continue
    found.update(m.decode() for m in re.findall(rb"TRUTH-[0-9a-f]{32}", data))
print(sorted(found))
"""


SELF_GRADE = """
import sys
frame = sys._getframe()
while frame is not None:
    for value in list(frame.f_locals.values()):
        if isinstance(value, dict) and "expected_stdout" in value:
            print(value["expected_stdout"])
            raise SystemExit(0)
    frame = frame.f_back
"""


def _shm_key(secret: str) -> int:
    return int(secret[-7:], 16)


def _sysv_shm_keys() -> set[int]:
    with open("/proc/sysvipc/shm") as handle:
        header, *rows = handle.read().splitlines()
    return {int(row.split()[header.split().index("key")]) for row in rows}


def main(workdir: str, secret: str) -> None:
    signals: list[int] = []
    signal.signal(signal.SIGUSR1, lambda number, _frame: signals.append(number))
    checkpoint = os.path.join(workdir, "checkpoint.pt")
    with open(checkpoint, "w") as handle:
        handle.write("weights")
    report: dict = {"uid": os.getuid()}
    key = os.path.join(workdir, "run.key")  # named by checkpoint_config.key_file
    with open(key, "w") as handle:
        handle.write(f"KEY-{secret}")
    os.chmod(key, 0o600)
    hide_from_calls(key)  # what the runtime does with checkpoint_config.key_file
    sock = os.path.join(workdir, "trainer.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock)
    os.chmod(sock, 0o777)  # reachable by any uid that may make a socket
    listener.listen(4)
    listener.setblocking(False)
    try:
        SandboxPool(1, limits=SandboxLimits(timeout_s=5)).close()
        report["strict_pool"] = "started"
    except WeakIsolationError as exc:
        report["strict_pool"] = f"refused: {exc}"
    with SandboxPool(1, limits=SandboxLimits(timeout_s=5, allow_weak_isolation=True)) as pool:
        report["isolation"] = pool.isolation
        report["stats"] = pool.stats()
        code = ATTACK.format(checkpoint=checkpoint, trainer=os.getpid(), secret=secret,
                             shm_key=_shm_key(secret), sock=sock, key=key,
                             worker=pool.worker_info["pid"])  # fmt: skip
        truth = f"TRUTH-{secret[-32:]}"
        report["grader_ok"] = pool.call("json:dumps", {"ground_truth": truth}).ok
        scan = pool.run_python(SCAN_MEMORY)  # an earlier call's argument, in a later call
        report["truth_seen_later"] = truth in scan.stdout or not scan.ok
        graded = pool.call("rl_envs.rewards.code_tests:code_sandbox_score", "code",
                           f"```python\n{SELF_GRADE}```", None, {}, case_type="stdin",
                           test_cases=[{"stdin": "", "expected_stdout": "EXPECTED"}])  # fmt: skip
        report["self_graded_score"] = graded.value["score"] if graded.ok else graded.error
        result = pool.run_python(code)
        report["call_ok"] = result.ok
        report["call_error"] = result.error
        report["attack"] = json.loads(result.stdout) if result.ok else None
    with open(checkpoint) as handle:
        report["checkpoint_after"] = handle.read()
    report["signals_received"] = signals
    try:
        listener.accept()
        report["socket_reached"] = True
    except BlockingIOError:
        report["socket_reached"] = False
    listener.close()
    report["left_in_tmp"] = os.path.exists(f"/tmp/left_by_call_{secret}")
    report["left_in_dev_shm"] = os.path.exists(f"/dev/shm/left_by_call_{secret}")
    report["left_in_sysv_shm"] = _shm_key(secret) in _sysv_shm_keys()
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
