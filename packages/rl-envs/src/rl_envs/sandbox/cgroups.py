"""One control group per sandbox worker: a TOTAL memory and task cap over every process a call
starts (rlimits are per process: four children under a 1 GiB RLIMIT_AS hold 4 GiB).

cgroup v2 is used where a writable parent has the ``memory`` and ``pids`` controllers; otherwise
the v1 ``memory`` and ``pids`` hierarchies where they are writable (hybrid hosts); otherwise
``open_slot_cgroup`` returns None and the sandbox falls back to rlimits alone. Trusted code only:
the worker creates the group, the call's leader process joins it before running anything.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path in the v1 hierarchy of ``controller`` ("" = v2)."""
    with contextlib.suppress(OSError):
        for line in _read("/proc/self/cgroup").splitlines():
            _, controllers, path = line.split(":", 2)
            names = controllers.split(",") if controllers else []
            if (controller in names) if controller else not names:
                return path
    return None


def _mount_of(controller: str) -> str | None:
    """Mount point of the v1 hierarchy of ``controller``, or of the unified (v2) one for ""."""
    with contextlib.suppress(OSError):
        for line in _read("/proc/self/mounts").splitlines():
            fields = line.split()
            if len(fields) < 4:
                continue
            if not controller and fields[2] == "cgroup2":
                return fields[1]
            if controller and fields[2] == "cgroup" and controller in fields[3].split(","):
                return fields[1]
    return None


@dataclass
class SlotCgroup:
    """A control group (one directory per controller) holding one worker's calls."""

    version: str  # "cgroup2" | "cgroup1"
    dirs: tuple[str, ...]  # v2: (group,), v1: (memory group, pids group)

    @property
    def memory_dir(self) -> str:
        return self.dirs[0]

    def set_limits(self, memory_bytes: int, max_tasks: int) -> None:
        if self.version == "cgroup2":
            group = self.dirs[0]
            _write(f"{group}/memory.max", str(memory_bytes))
            with contextlib.suppress(OSError):
                _write(f"{group}/memory.swap.max", "0")
            with contextlib.suppress(OSError):
                _write(f"{group}/memory.oom.group", "1")
            _write(f"{group}/pids.max", str(max_tasks))
        else:
            memory, pids = self.dirs
            _write(f"{memory}/memory.limit_in_bytes", str(memory_bytes))
            with contextlib.suppress(OSError):
                _write(f"{memory}/memory.memsw.limit_in_bytes", str(memory_bytes))
            _write(f"{pids}/pids.max", str(max_tasks))

    def enter(self) -> None:
        """Move the calling process into every directory of the group."""
        for group in self.dirs:
            _write(f"{group}/cgroup.procs", "0")

    def pids(self) -> list[int]:
        found: set[int] = set()
        for group in self.dirs:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in _read(f"{group}/cgroup.procs").split())
        return sorted(found)

    def oom_kills(self) -> int:
        """How many processes the kernel killed for exceeding the memory cap so far."""
        name = "memory.events" if self.version == "cgroup2" else "memory.oom_control"
        with contextlib.suppress(OSError):
            for line in _read(f"{self.memory_dir}/{name}").splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def kill_all(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL every process in the group; True once it is empty."""
        if self.version == "cgroup2":
            with contextlib.suppress(OSError):
                _write(f"{self.dirs[0]}/cgroup.kill", "1")
        deadline = time.monotonic() + timeout_s
        while True:
            pids = self.pids()
            if not pids:
                return True
            if time.monotonic() > deadline:
                return False
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)

    def remove(self) -> None:
        """Kill what is left in the group and delete it (best effort, bounded)."""
        self.kill_all(timeout_s=1.0)
        for group in self.dirs:
            for _ in range(100):  # the last killed processes leave the group asynchronously
                try:
                    os.rmdir(group)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def _try_v2(name: str) -> SlotCgroup | None:
    mount = _mount_of("")
    own = _own_cgroup("")
    if mount is None or own is None:
        return None
    # A v2 group with processes cannot enable controllers for children (except the root), so the
    # slot group goes under the root when we are in it, else beside our own group.
    parents = [mount] if own == "/" else [os.path.dirname(f"{mount}{own}")]
    for parent in parents:
        try:
            enabled = _read(f"{parent}/cgroup.subtree_control").split()
            missing = [c for c in ("memory", "pids") if c not in enabled]
            if missing:
                available = _read(f"{parent}/cgroup.controllers").split()
                if any(c not in available for c in missing):
                    continue
                _write(f"{parent}/cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
            group = f"{parent}/{name}"
            os.makedirs(group, exist_ok=True)
            return SlotCgroup("cgroup2", (group,))
        except OSError:
            continue
    return None


def _try_v1(name: str) -> SlotCgroup | None:
    dirs = []
    for controller in ("memory", "pids"):
        own = _own_cgroup(controller)
        base = _mount_of(controller)
        if own is None or base is None:
            return None
        group = f"{base}{own.rstrip('/')}/{name}"
        try:
            os.makedirs(group, exist_ok=True)
        except OSError:
            for made in dirs:
                with contextlib.suppress(OSError):
                    os.rmdir(made)
            return None
        dirs.append(group)
    return SlotCgroup("cgroup1", tuple(dirs))


def open_slot_cgroup(name: str, memory_bytes: int, max_tasks: int) -> SlotCgroup | None:
    """Create (or reuse) the group ``name`` with the given caps; None where cgroups are not
    writable. A reused group is emptied first (a replaced worker's leftovers die)."""
    for attempt in (_try_v2, _try_v1):
        group = attempt(name)
        if group is None:
            continue
        try:
            group.kill_all(timeout_s=2.0)
            group.set_limits(memory_bytes, max_tasks)
            probe = os.fork()  # can a process actually be moved in? (refused in some containers)
            if probe == 0:
                try:
                    group.enter()
                    os._exit(0)
                except BaseException:
                    os._exit(1)
            _, status = os.waitpid(probe, 0)
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                return group
        except OSError:
            pass
        group.remove()
    return None


__all__ = ["SlotCgroup", "open_slot_cgroup"]
