"""Where the cores go: CPU seconds of this process tree by role over a window (Linux /proc).

`ProcessCpu` samples the utime + stime (and the reaped children's) of this process and every
descendant (Ray's raylet and workers, the reward sandbox's workers and their forks) every
`interval` seconds on a daemon thread. A child reaped within the window counts once (its
parent's reaped-children total, less what its own readings counted); a fork too short to be
sampled still counts through its parent. `mark(name)` stamps the latest sample; `cores(a, b)` is
the CPU seconds per role between two marks divided by the wall seconds between them: 1.0 = one
core busy all the time. Roles come from process titles (`ray::TrainWorker...`), so a role's
processes are summed; `driver` is this process.
"""

from __future__ import annotations

import os
import threading
import time
from typing import NamedTuple

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
ROLES = (  # (substring of the command line, role), first match wins
    ("ray::TrainWorker", "train_worker"),
    ("ray::RolloutWorker", "rollout_worker"),
    ("rl_envs.sandbox", "reward_sandbox"),
    ("ray::", "ray_other"),
    ("raylet", "ray_daemons"),
    ("gcs_server", "ray_daemons"),
    ("ray/", "ray_daemons"),
)
#: roles a process keeps once it has one (a Ray worker starts as `.../ray/.../default_worker.py`,
#: a "ray_daemons" title, and retitles itself `ray::TrainWorker...` when it becomes an actor)
FINAL_ROLES = frozenset({"train_worker", "rollout_worker", "reward_sandbox", "driver"})


def role_of(command: str) -> str:
    for needle, role in ROLES:
        if needle in command:
            return role
    return "other"


class Reading(NamedTuple):
    role: str
    parent: int
    own: float  # utime + stime, seconds
    reaped: float  # cutime + cstime: the children it has waited for (their own + reaped)
    gone: bool  # no longer in /proc: the last reading is kept


def _read_file(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def _stat(pid: int) -> tuple[int, int, float, float, str] | None:
    """(parent pid, start time in ticks, own and reaped children's CPU seconds, process name)
    of `pid` from /proc/<pid>/stat, None if gone."""
    try:
        stat = _read_file(f"/proc/{pid}/stat").decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    own, reaped = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    return int(fields[1]), int(fields[19]), own / TICK, reaped / TICK, name


def _command(pid: int, name: str) -> str:
    """The command line of `pid` (its name from stat when it has none or is gone)."""
    try:
        command = _read_file(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return name
    return command or name


class ProcessCpu:
    """Samples CPU seconds per process of this tree; see the module docstring."""

    def __init__(self, interval: float = 0.5) -> None:
        self.root = os.getpid()
        self.interval = interval
        self.cpu: dict[int, Reading] = {}  # latest per pid of the tree, gone ones included
        self.marks: dict[str, tuple[float, dict[int, Reading]]] = {}
        self._roles: dict[tuple[int, int], str] = {}  # (pid, start time) -> role
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="proc-cpu", daemon=True)

    def __enter__(self) -> ProcessCpu:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        """One reading of the tree: /proc/<pid>/stat of every process (for the parent links),
        the command line of a tree member only until it has one of the `FINAL_ROLES` (kept per
        pid and start time). Cheap on purpose: this thread shares the cores it measures
        (reading every command line every 0.25 s cost the driver ~0.1 core under Ray)."""
        procs = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (info := _stat(int(entry))) is not None:
                procs[int(entry)] = info
        tree, frontier = {self.root}, [self.root]
        children: dict[int, list[int]] = {}
        for pid, info in procs.items():
            children.setdefault(info[0], []).append(pid)
        while frontier:
            for child in children.get(frontier.pop(), []):
                if child not in tree:
                    tree.add(child)
                    frontier.append(child)
        with self._lock:
            for pid, reading in self.cpu.items():  # gone: its parent has reaped it
                if pid not in procs and not reading.gone:
                    self.cpu[pid] = reading._replace(gone=True)
            for pid in tree & procs.keys():
                parent, started, own, reaped, name = procs[pid]
                role = self._roles.get((pid, started))
                if role is None:
                    role = "driver" if pid == self.root else role_of(_command(pid, name))
                    if role in FINAL_ROLES:  # others may still retitle (a Ray worker) or exec
                        self._roles[(pid, started)] = role
                self.cpu[pid] = Reading(role, parent, own, reaped, False)

    def mark(self, name: str) -> None:
        """Stamp now with a fresh sample under `name`."""
        self._sample()
        with self._lock:
            self.marks[name] = (time.perf_counter(), dict(self.cpu))

    def cores(self, start: str, end: str) -> dict[str, float]:
        """Average cores busy per role between marks `start` and `end` (and `total`)."""
        (t0, before), (t1, after) = self.marks[start], self.marks[end]
        busy: dict[str, float] = {}
        for pid, now in after.items():
            then = before.get(pid)
            spent = now.own + now.reaped - (then.own + then.reaped if then else 0.0)
            busy[now.role] = busy.get(now.role, 0.0) + spent
            parent = after.get(now.parent)
            if now.gone and not (then and then.gone) and parent is not None:
                # reaped in the window: the parent's `reaped` holds all of it, which counted
                # the sampled part twice
                busy[parent.role] = busy.get(parent.role, 0.0) - (now.own + now.reaped)
        wall = max(t1 - t0, 1e-9)
        out = {role: round(s / wall, 2) for role, s in sorted(busy.items()) if s > 0.005 * wall}
        out["total"] = round(sum(busy.values()) / wall, 2)
        return out
