"""No socket of any family from inside a sandboxed call (``rl_envs.sandbox.seccomp``).

A network namespace does not scope unix sockets bound to files nor vsock: each test here is an
attack that reached outside the sandbox before the seccomp filter (the non-root mode is run for
real in ``test_envs_sandbox_escapes.py`` through ``sandbox_scenario.py``, which makes the same
attempts).
"""

from __future__ import annotations

import errno
import os
import platform
import socket
import textwrap
import uuid
from pathlib import Path

import pytest

from rl_envs.sandbox import seccomp

pytestmark = pytest.mark.xdist_group("dist")  # starts sandbox worker processes

AF_VSOCK = 40


@pytest.fixture
def unix_listener():
    """A world-writable pathname unix socket outside the sandbox (a container daemon's or a
    session bus's socket is reachable like this)."""
    base = Path("/var/tmp") / f"rl_sandbox_sock_{uuid.uuid4().hex}"
    base.mkdir(mode=0o755)
    path = base / "service.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    path.chmod(0o777)
    server.listen(8)
    server.setblocking(False)
    yield server, str(path)
    server.close()
    path.unlink(missing_ok=True)
    base.rmdir()


def test_pathname_unix_socket_is_out_of_reach(hostile_pool, unix_listener):
    server, path = unix_listener
    code = textwrap.dedent(f"""
        import ctypes, socket
        out = []
        for family, kind in ((socket.AF_UNIX, socket.SOCK_STREAM), (socket.AF_UNIX, socket.SOCK_DGRAM)):
            try:
                s = socket.SocketType(family, kind)
                s.connect({path!r})
                out.append("connected")
            except OSError as exc:
                out.append(exc.errno)
        libc = ctypes.CDLL(None, use_errno=True)
        out.append(libc.socket(1, 1, 0) >= 0 or ctypes.get_errno())  # raw syscall, no Python
        try:  # a datagram pair is connected, but sendto() names any other address
            a, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            a.sendto(b"x", {path!r})
            out.append("sent")
        except OSError as exc:
            out.append(exc.errno)
        print(out)
    """)
    result = hostile_pool.run_python(code)
    assert result.ok, result
    assert result.stdout.strip() == str([errno.EPERM] * 4), result.stdout
    with pytest.raises(BlockingIOError):
        server.accept()


@pytest.mark.parametrize(
    "family",
    [socket.AF_INET, socket.AF_INET6, AF_VSOCK, socket.AF_NETLINK, socket.AF_PACKET],
    ids=["inet", "inet6", "vsock", "netlink", "packet"],
)
def test_every_socket_family_is_refused(hostile_pool, family):
    """Refused with EPERM, whether or not the family exists on this host (before the filter a
    vsock socket opened wherever the module is loaded)."""
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.SocketType({int(family)}, socket.SOCK_DGRAM)\n"
        "    print('opened')\n"
        "except OSError as exc:\n"
        "    print(type(exc).__name__, exc.errno)\n"
    )
    result = hostile_pool.run_python(code)
    assert result.ok, result
    assert result.stdout.split() == ["PermissionError", str(errno.EPERM)], result.stdout


def test_io_uring_and_other_processes_memory_are_refused(hostile_pool):
    """io_uring ops (which can open sockets) are not seen by seccomp: its setup is refused, and
    so are ptrace and process_vm_readv."""
    numbers = seccomp.SYSCALLS[platform.machine()][1]
    code = textwrap.dedent(f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        params = ctypes.create_string_buffer(120)
        out = []
        for nr, args in (({numbers["io_uring_setup"]}, (8, params)), ({numbers["ptrace"]}, (0, 0, 0, 0)),
                         ({numbers["process_vm_readv"]}, (1, 0, 0, 0, 0, 0))):
            out.append(libc.syscall(nr, *args) >= 0 or ctypes.get_errno())
        print(out)
    """)
    result = hostile_pool.run_python(code)
    assert result.ok, result
    assert result.stdout.strip() == str([errno.EPERM] * 3), result.stdout


def test_asyncio_still_runs_in_a_call(hostile_pool):
    """The one socket a call keeps: an AF_UNIX stream pair (asyncio's self-pipe)."""
    result = hostile_pool.run_python(
        "import asyncio\nprint(asyncio.run(asyncio.sleep(0, 'ran')))\n"
    )
    assert result.ok and result.stdout == "ran\n", result


def test_pool_reports_the_filter(hostile_pool):
    assert hostile_pool.isolation["sockets"] == "seccomp"
    assert hostile_pool.isolation["groups"] in ("dropped", "kept")
    if os.geteuid() == 0:
        assert hostile_pool.isolation["groups"] == "dropped"


# ----- the filter program itself, for both machines (the other one through a model of BPF) ----
DENY = seccomp.SECCOMP_RET_ERRNO | errno.EPERM
KILL = seccomp.SECCOMP_RET_KILL_PROCESS
ALLOW = seccomp.SECCOMP_RET_ALLOW


@pytest.mark.parametrize("machine", sorted(seccomp.SYSCALLS))
def test_filter_program_decides_per_machine(machine):
    arch, numbers = seccomp.SYSCALLS[machine]
    prog = seccomp.build_filter(machine)

    def run(nr: int, *args: int, on_arch: int = arch) -> int:
        return seccomp.run_filter(prog, nr, on_arch, list(args))

    for name in seccomp.DENIED:
        assert run(numbers[name], 1, 1) == DENY, name
    sp = numbers["socketpair"]
    assert run(sp, socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) == ALLOW
    assert run(sp, socket.AF_UNIX, socket.SOCK_DGRAM) == DENY
    assert run(sp, socket.AF_UNIX, socket.SOCK_SEQPACKET) == DENY
    assert run(sp, socket.AF_INET, socket.SOCK_STREAM) == DENY
    write, read = {"x86_64": (1, 0), "aarch64": (64, 63)}[machine]
    assert run(write) == ALLOW and run(read) == ALLOW
    assert run(write, on_arch=0x40000003) == KILL  # i386 / arm32 compat calls
    if machine == "x86_64":
        assert run(seccomp.X32_SYSCALL_BIT | 41) == KILL  # x32 socket


def test_unknown_machine_fails_closed():
    with pytest.raises(seccomp.SeccompUnavailable, match="riscv64"):
        seccomp.build_filter("riscv64")
    with pytest.raises(seccomp.SeccompUnavailable, match="riscv64"):
        seccomp.install("riscv64")
