"""SysV IPC objects a call left behind where it had no IPC namespace of its own.

Where the kernel refuses namespaces (Docker's default seccomp profile) a call's shared-memory
segments, semaphore sets and message queues outlive it, and a call can create them world
writable (mode 0666). When the slot runs calls under its own uid, the worker removes every
object that uid created or owns after each call (``remove_left_by``), as it removes the uid's
files in the shared temp dirs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable

IPC_RMID = 0
_libc = ctypes.CDLL(None, use_errno=True)
# /proc/sysvipc table -> (its id column, removal of one object by id: 0 on success)
_TABLES: dict[str, tuple[str, Callable[[int], int]]] = {
    "shm": ("shmid", lambda ipc_id: _libc.shmctl(ipc_id, IPC_RMID, None)),
    "sem": ("semid", lambda ipc_id: _libc.semctl(ipc_id, 0, IPC_RMID)),
    "msg": ("msqid", lambda ipc_id: _libc.msgctl(ipc_id, IPC_RMID, None)),
}


def objects_of(uid: int, table: str) -> list[int]:
    """Ids of the ``table`` (shm | sem | msg) objects ``uid`` created or owns, as
    ``/proc/sysvipc/<table>`` lists them; [] where it cannot be read."""
    id_column = _TABLES[table][0]
    try:
        with open(f"/proc/sysvipc/{table}") as handle:
            header, *rows = handle.read().splitlines()
    except (OSError, ValueError):
        return []
    names = header.split()
    at = {name: names.index(name) for name in (id_column, "uid", "cuid") if name in names}
    if len(at) != 3:
        return []
    ids = []
    for row in rows:
        fields = row.split()
        with contextlib.suppress(IndexError, ValueError):
            if uid in (int(fields[at["uid"]]), int(fields[at["cuid"]])):
                ids.append(int(fields[at[id_column]]))
    return ids


def remove_left_by(uid: int) -> int:
    """Remove every SysV shared-memory segment, semaphore set and message queue ``uid``
    created or owns; returns how many went. A root worker acts with ``uid`` as its effective
    uid meanwhile: the creator may remove its objects, root without CAP_SYS_ADMIN (Docker)
    may not."""
    found = [(remove, ipc_id) for table, (_, remove) in _TABLES.items()
             for ipc_id in objects_of(uid, table)]  # fmt: skip
    if not found:
        return 0
    switch = os.geteuid() == 0 and uid != 0
    if switch:
        os.seteuid(uid)
    try:
        return sum(remove(ipc_id) == 0 for remove, ipc_id in found)
    finally:
        if switch:
            os.seteuid(0)


__all__ = ["objects_of", "remove_left_by"]
