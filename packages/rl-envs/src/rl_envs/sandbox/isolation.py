"""Linux namespaces and mounts for sandboxed calls (trusted code, run before untrusted code).

Per worker: an empty network namespace (``isolate_network``). Per call: the worker forks the
call straight into new mount, pid and SysV IPC namespaces (``fork_into_call_namespaces``, one
clone(2), so a large worker is copied once), and the call, pid 1 there, runs ``private_mounts``:
the whole file tree read-only with the user's credentials hidden (``credentials``), a fresh
size-capped tmpfs on ``/tmp``, an empty read-only ``/dev/shm`` and a ``/proc`` that shows only
the call's own processes. Every call leaves the trainer's kernel keyrings
(``leave_callers_keyrings``). When pid 1 exits the
kernel kills the rest of the namespace, and everything mounted there, and every shared-memory
segment, semaphore and message queue the call created, disappears.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import signal
import sys
from collections.abc import Sequence
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REC = 0x4000
MS_BIND = 0x1000
MS_PRIVATE = 1 << 18
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
SYS_MOUNT_SETATTR = 442  # same number on x86_64 and aarch64 (unified syscall table)

CALL_NAMESPACES = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC
_SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(platform.machine())

_libc = ctypes.CDLL(None, use_errno=True)
_libc_holding_gil = ctypes.PyDLL(None, use_errno=True)  # the clone must not release the GIL
_libc_holding_gil.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]  # fmt: skip


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]  # fmt: skip


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def unshare(flags: int) -> bool:
    return _libc.unshare(flags) == 0


def _map_self(uid: int, gid: int) -> None:
    """Inside a fresh user namespace: map the caller's outside ids to 0 (the only ids an
    unprivileged process may map)."""
    with open("/proc/self/setgroups", "w") as handle:
        handle.write("deny")
    with open("/proc/self/uid_map", "w") as handle:
        handle.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as handle:
        handle.write(f"0 {gid} 1")


def isolate_network(can_switch_uid: bool) -> str:
    """Put the worker in an empty network namespace. Returns ``"netns"`` (as root),
    ``"userns+netns"`` (without root, inside a user namespace that maps our uid to 0, which
    also lets calls create mount and pid namespaces) or ``"none"`` (namespaces refused)."""
    if can_switch_uid and unshare(CLONE_NEWNET):
        return "netns"
    if not can_switch_uid:
        uid, gid = os.geteuid(), os.getegid()
        if unshare(CLONE_NEWUSER | CLONE_NEWNET):
            with contextlib.suppress(OSError):  # unmapped (e.g. AppArmor): no mounts, still no net
                _map_self(uid, gid)
            return "userns+netns"
    return "none"


def fork_into_call_namespaces() -> int:
    """``os.fork()`` whose child starts in new mount, pid and IPC namespaces (it is pid 1 of
    the pid namespace). Python's fork hooks run as for ``os.fork``. Raises OSError where
    refused."""
    return clone_fork(CALL_NAMESPACES)


def clone_fork(clone_flags: int) -> int:
    """``os.fork()`` through clone(2) with ``clone_flags`` (namespaces, ``CLONE_PARENT``): 0
    in the child, its pid in the parent. Raises OSError where refused."""
    if _SYS_CLONE is None:
        raise OSError(38, f"clone with namespaces is not wired for {platform.machine()}")
    ctypes.pythonapi.PyOS_BeforeFork()
    flags = ctypes.c_long(clone_flags | signal.SIGCHLD)
    null = ctypes.c_long(0)  # no new stack, no tid pointers, no tls: fork semantics
    pid = _libc_holding_gil.syscall(ctypes.c_long(_SYS_CLONE), flags, null, null, null, null)
    if pid == 0:
        ctypes.pythonapi.PyOS_AfterFork_Child()
        return 0
    errno = ctypes.get_errno()
    ctypes.pythonapi.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(errno, f"clone(call namespaces): {os.strerror(errno)}")
    return int(pid)


def _mount(source: str, target: str, fstype: str, flags: int, data: str = "") -> None:
    result = _libc.mount(source.encode(), target.encode(), fstype.encode(), flags,
                         data.encode() if data else None)  # fmt: skip
    _check(result, f"mount {fstype} on {target}")


def _read_only_tree(path: str = "/") -> None:
    attr = _MountAttr(attr_set=MOUNT_ATTR_RDONLY)
    result = _libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), AT_RECURSIVE,
                           ctypes.byref(attr), ctypes.sizeof(attr))  # fmt: skip
    _check(result, f"mount_setattr({path}, read-only)")


def import_roots_under(tmp: str = "/tmp") -> list[str]:
    """Directories Python runs and imports from that lie under ``tmp`` (a venv or a checkout
    cloned there, e.g. a CI clone in /tmp): outermost first, ``tmp`` itself excluded. They stay
    visible, read-only, through the call's private ``tmp``; nothing else of the host's does."""
    real = {os.path.realpath(p) for p in (sys.prefix, sys.exec_prefix, *sys.path) if p}
    under = sorted(p for p in real if p.startswith(tmp + os.sep) and os.path.isdir(p))
    roots: list[str] = []
    for path in under:
        if not any(path.startswith(root + os.sep) for root in roots):
            roots.append(path)
    return roots


def private_mounts(
    tmp_bytes: int, owner_uid: int, owner_gid: int, hidden: Sequence[str] = ()
) -> dict[str, Any]:
    """In pid 1 of the call's namespaces: read-only tree, the ``hidden`` paths (the user's
    credentials: rl_envs.sandbox.credentials) empty, private ``/tmp`` (``tmp_bytes``, owned by
    the call's uid), no writable ``/dev/shm``, a ``/proc`` of this pid namespace."""
    _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    _read_only_tree()
    masked = sum(_hide(path) for path in hidden)
    size_kb = max(tmp_bytes // 1024, 64)
    keep = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in import_roots_under()]
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={size_kb}k,mode=0700,uid={owner_uid},gid={owner_gid}")  # fmt: skip
    for path, fd in keep:  # the interpreter's own files under /tmp, read-only
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, "", MS_BIND | MS_REC)
        _read_only_tree(path)
        os.close(fd)
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
               "size=4k,mode=0555")  # fmt: skip
    try:  # refused where the host /proc is partly masked (containers) inside a user namespace
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        proc = "pidns"
    except OSError:
        proc = "host"
    return {"fs": "read-only", "tmp": "private", "dev_shm": "none", "proc": proc,
            "credentials": f"hidden {masked} of {len(hidden)}"}  # fmt: skip


def _hide(path: str) -> bool:
    """Cover ``path`` in this mount namespace: an empty read-only tmpfs over a directory,
    ``/dev/null`` over a file. False if it no longer exists or cannot be covered (counted in
    the call's report)."""
    try:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                   "size=4k,mode=0555")  # fmt: skip
        elif os.path.exists(path):
            _mount("/dev/null", path, "", MS_BIND)
        else:
            return False
    except OSError:
        return False
    return True


PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
_CAP_VERSION_3 = 0x20080522


def drop_bounding_capabilities() -> None:
    """Empty the capability bounding set (no capability can come back through execve). Needs
    CAP_SETPCAP: call it before giving up root."""
    for cap in range(64):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last capability


KEYCTL_JOIN_SESSION_KEYRING = 1
KEYCTL_CLEAR = 7
KEY_SPEC_USER_KEYRING = -4
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(platform.machine())


def leave_callers_keyrings(own_uid: bool) -> None:
    """Join a new, empty session keyring. The session keyring is inherited through fork,
    setsid and a change of uid, and whoever holds it may read every key the trainer (or its
    login) put there (tokens, Kerberos tickets). ``own_uid``: the call runs as its slot's uid,
    whose user keyring is emptied too (what an earlier call of the slot left there); never
    with the caller's uid, whose user keyring is the user's. Where keyctl is refused (Docker's
    default seccomp profile, a kernel without keys) the call is refused it too, and there is
    nothing to leave. Run it after the drop to the call's uid."""
    if _SYS_KEYCTL is None:
        raise OSError(38, f"keyctl is not wired for {platform.machine()}")
    keyctl = _libc.syscall
    joined = keyctl(ctypes.c_long(_SYS_KEYCTL), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING),
                    ctypes.c_char_p(None))  # fmt: skip
    if joined < 0:
        errno = ctypes.get_errno()
        if errno in (1, 38):  # EPERM, ENOSYS: keyctl refused to the call as well
            return
        raise OSError(errno, f"keyctl(join session keyring): {os.strerror(errno)}")
    if not own_uid:
        return
    cleared = keyctl(ctypes.c_long(_SYS_KEYCTL), ctypes.c_long(KEYCTL_CLEAR),
                     ctypes.c_long(KEY_SPEC_USER_KEYRING))  # fmt: skip
    _check(cleared, "keyctl(clear user keyring)")


def drop_capabilities() -> None:
    """Clear the effective, permitted and inheritable sets and forbid new privileges. Matters
    inside a user namespace, where the call keeps uid 0 and would otherwise hold
    CAP_SYS_ADMIN over its own mount namespace (and could remount the tree writable)."""
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.capset(header, data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")


__all__ = [
    "clone_fork",
    "drop_bounding_capabilities",
    "drop_capabilities",
    "fork_into_call_namespaces",
    "isolate_network",
    "leave_callers_keyrings",
    "private_mounts",
    "unshare",
]
