"""Host-wide claims on sandbox uids: every live call slot, in every pool on the host, runs its
calls under a uid no other slot uses.

A uid is shared state of the whole host: RLIMIT_NPROC counts the processes of a uid host-wide,
and without pid namespaces any process of a uid can signal the others. Two pools whose slots ran
calls under the same uid (two rollout workers on one node, two test processes) would share both:
one call's sleeping children made the other's ``fork`` fail. So a slot claims its uid with an
exclusive ``flock`` on ``<lock dir>/<uid>.lock``, held by the (trusted) worker for its life and
released by the kernel when the worker dies, however it dies. The lock directory belongs to the
pool's user and nobody else may write it; the call processes never get the lock's descriptor.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from pathlib import Path

#: how many uids above ``uid_base`` a host's slots may claim
UID_SPAN = 4096
LOCK_DIR_NAME = "rl-sandbox-uids"


def default_lock_dir() -> Path:
    """``/run/rl-sandbox-uids`` where /run is writable (root on Linux), else under the temp dir."""
    run = Path("/run")
    base = run if run.is_dir() and os.access(run, os.W_OK) else Path(tempfile.gettempdir())
    return base / LOCK_DIR_NAME


def _checked_lock_dir(path: Path) -> Path:
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise PermissionError(
            f"sandbox uid lock directory {path} must be a real directory owned by uid "
            f"{os.geteuid()} and writable by nobody else (found mode {oct(info.st_mode)}, "
            f"owner {info.st_uid}); remove it"
        )
    return path


def claim_uid(
    uid_base: int, first: int = 0, *, span: int = UID_SPAN, lock_dir: Path | None = None
) -> tuple[int, int]:
    """Claim the first free uid of ``uid_base + first, uid_base + first + 1, ...`` (wrapping
    within ``span``); returns ``(uid, fd)``. The claim lasts while ``fd`` is open (close it to
    release; a dead process releases it too). Raises RuntimeError when all ``span`` are taken."""
    directory = _checked_lock_dir(lock_dir or default_lock_dir())
    for i in range(span):
        uid = uid_base + (first + i) % span
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(directory / f"{uid}.lock", flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return uid, fd
    raise RuntimeError(
        f"all {span} sandbox uids from {uid_base} are claimed by live sandbox slots on this host "
        f"(locks in {directory})"
    )


__all__ = ["UID_SPAN", "claim_uid", "default_lock_dir"]
