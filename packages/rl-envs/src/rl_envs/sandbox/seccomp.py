"""A seccomp filter that takes sockets away from a sandboxed call (trusted code, run last
before untrusted code).

A network namespace empties the IP stack, but it does not scope AF_UNIX sockets bound to files
(``connect()`` ignores read-only mounts: a user's service manager or a container daemon's socket
stays reachable) nor AF_VSOCK (the host's port space). So each call installs, after its limits and
its uid drop, a classic-BPF filter (``PR_SET_SECCOMP``, with ``PR_SET_NO_NEW_PRIVS``) that fails
with ``EPERM``: ``socket`` of every family, ``connect``, ``bind``, ``listen``, ``accept``,
``accept4``; ``socketpair`` except an ``AF_UNIX`` ``SOCK_STREAM`` pair (asyncio's self-pipe: it is
connected, so it can reach nothing else); ``io_uring_setup``/``enter``/``register`` (io_uring ops
bypass seccomp); ``ptrace``, ``process_vm_readv``/``writev`` (no reading another process's memory);
and a system call of another ABI (i386 or x32 on x86_64, arm32 on aarch64) kills the process.
Inherited by every process the call starts; it cannot be removed.

Built by hand for x86_64 and aarch64 (the syscall tables below). Any other machine fails closed:
``install`` raises ``SeccompUnavailable`` naming the machine, and the pool refuses to start
(unless weak isolation is accepted).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct
from typing import Any

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_KILL_PROCESS = 0x80000000
AF_UNIX = 1
SOCK_STREAM = 1
SOCK_TYPE_MASK = 0xF  # SOCK_NONBLOCK / SOCK_CLOEXEC ride in the same argument
X32_SYSCALL_BIT = 0x40000000

# classic BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_AND_K = 0x54
_RET_K = 0x06
# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24

#: per machine: (AUDIT_ARCH, {syscall name: number}); numbers from the kernel's tables
SYSCALLS: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "socket": 41,
            "connect": 42,
            "accept": 43,
            "bind": 49,
            "listen": 50,
            "socketpair": 53,
            "accept4": 288,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "socket": 198,
            "socketpair": 199,
            "bind": 200,
            "listen": 201,
            "accept": 202,
            "connect": 203,
            "accept4": 242,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
        },
    ),
}
DENIED = ("socket", "connect", "bind", "listen", "accept", "accept4", "ptrace",
          "process_vm_readv", "process_vm_writev", "io_uring_setup", "io_uring_enter",
          "io_uring_register")  # fmt: skip


class SeccompUnavailable(OSError):
    """The socket filter cannot be installed here (an unknown machine, or seccomp refused)."""


def _insn(code: int, jt: int, jf: int, k: int) -> tuple[int, int, int, int]:
    return (code, jt, jf, k & 0xFFFFFFFF)


def build_filter(machine: str) -> list[tuple[int, int, int, int]]:
    """The program as ``(code, jt, jf, k)`` instructions for ``machine`` (``platform.machine()``
    spelling); ``SeccompUnavailable`` for a machine without a table."""
    if machine not in SYSCALLS:
        raise SeccompUnavailable(
            errno.ENOSYS,
            f"no seccomp socket filter for machine {machine!r} (known: {sorted(SYSCALLS)}): "
            "sandboxed calls could open sockets here",
        )
    arch, numbers = SYSCALLS[machine]
    deny = SECCOMP_RET_ERRNO | errno.EPERM
    allow = SECCOMP_RET_ALLOW
    kill = SECCOMP_RET_KILL_PROCESS
    prog = [_insn(_LD_W_ABS, 0, 0, _ARCH), _insn(_JEQ_K, 1, 0, arch), _insn(_RET_K, 0, 0, kill),
            _insn(_LD_W_ABS, 0, 0, _NR)]  # fmt: skip
    if machine == "x86_64":  # the x32 ABI shares the arch value: refuse its numbers
        prog += [_insn(_JGE_K, 0, 1, X32_SYSCALL_BIT), _insn(_RET_K, 0, 0, kill)]
    for name in DENIED:
        prog += [_insn(_JEQ_K, 0, 1, numbers[name]), _insn(_RET_K, 0, 0, deny)]
    # socketpair: only AF_UNIX + SOCK_STREAM
    prog += [
        _insn(_JEQ_K, 0, 6, numbers["socketpair"]),
        _insn(_LD_W_ABS, 0, 0, _ARG0),
        _insn(_JEQ_K, 0, 3, AF_UNIX),
        _insn(_LD_W_ABS, 0, 0, _ARG1),
        _insn(_AND_K, 0, 0, SOCK_TYPE_MASK),
        _insn(_JEQ_K, 1, 0, SOCK_STREAM),
        _insn(_RET_K, 0, 0, deny),
        _insn(_RET_K, 0, 0, allow),
    ]
    return prog


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(machine: str | None = None) -> None:
    """Install the filter on this process (and all it will start). Raises
    ``SeccompUnavailable`` where it cannot: nothing untrusted may run then."""
    prog = build_filter(machine or platform.machine())
    raw = b"".join(struct.pack("=HBBI", *insn) for insn in prog)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    fprog = _SockFprog(len(prog), ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                           ctypes.c_ulong]  # fmt: skip
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        code = ctypes.get_errno()
        raise SeccompUnavailable(code, f"PR_SET_NO_NEW_PRIVS: {errno.errorcode.get(code, code)}")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        code = ctypes.get_errno()
        raise SeccompUnavailable(
            code, f"seccomp filter refused by the kernel: {errno.errorcode.get(code, code)}"
        )


def explain_python_sockets() -> None:
    """After ``install``: ``socket.socket(...)`` raises ``PermissionError`` saying why, instead
    of a bare "Operation not permitted" (the filter is what refuses; this is only the message)."""
    import socket

    base = socket.socket
    if not isinstance(base, type) or not issubclass(base, socket.SocketType):
        return  # already replaced (the weak mode's Python-level block)

    class SandboxSocket(base):  # type: ignore[valid-type,misc]
        def __init__(self, family: Any = -1, type: Any = -1, proto: int = -1,
                     fileno: Any = None) -> None:  # fmt: skip
            try:
                super().__init__(family, type, proto, fileno)
            except PermissionError as exc:
                raise PermissionError(
                    errno.EPERM, "sockets are disabled in the sandbox (seccomp filter)"
                ) from exc

    SandboxSocket.__name__ = SandboxSocket.__qualname__ = "socket"
    socket.socket = SandboxSocket  # type: ignore[misc]


def run_filter(prog: list[tuple[int, int, int, int]], nr: int, arch: int, args: list[int]) -> int:
    """Evaluate ``prog`` on one system call the way the kernel does (only the opcodes
    ``build_filter`` uses): the action word. For tests of the other machine's table."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    acc = 0
    pc = 0
    while True:
        code, jt, jf, k = prog[pc]
        pc += 1
        if code == _LD_W_ABS:
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == _AND_K:
            acc &= k
        elif code == _JEQ_K:
            pc += jt if acc == k else jf
        elif code == _JGE_K:
            pc += jt if acc >= k else jf
        elif code == _RET_K:
            return k
        else:
            raise ValueError(f"opcode {code:#x} not modelled")


__all__ = ["DENIED", "SYSCALLS", "SeccompUnavailable", "build_filter", "explain_python_sockets",
           "install", "run_filter"]  # fmt: skip
