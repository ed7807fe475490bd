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
from pathlib import Path
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


def _read(pid: int) -> tuple[int, str, float, float] | None:
    """(parent pid, command line, own and reaped children's CPU seconds) of `pid`, None if
    gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        command = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    own, reaped = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
    name = command or stat[stat.index("(") + 1 : stat.rindex(")")]
    return int(fields[1]), name, own / TICK, reaped / TICK


class ProcessCpu:
    """Samples CPU seconds per process of this tree; see the module docstring."""

    def __init__(self, interval: float = 0.25) -> None:
        self.root = os.getpid()
        self.interval = interval
        self.cpu: dict[int, Reading] = {}  # latest per pid of the tree, gone ones included
        self.marks: dict[str, tuple[float, dict[int, Reading]]] = {}
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
        procs = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (info := _read(int(entry))) is not None:
                procs[int(entry)] = info
        tree, frontier = {self.root}, [self.root]
        children: dict[int, list[int]] = {}
        for pid, (parent, _, _, _) in procs.items():
            children.setdefault(parent, []).append(pid)
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
                parent, command, own, reaped = procs[pid]
                role = "driver" if pid == self.root else role_of(command)
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
                busy[parent.role] -= now.own + now.reaped
        wall = max(t1 - t0, 1e-9)
        out = {role: round(s / wall, 2) for role, s in sorted(busy.items()) if s > 0.005 * wall}
        out["total"] = round(sum(busy.values()) / wall, 2)
        return out
