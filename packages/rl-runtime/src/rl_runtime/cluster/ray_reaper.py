"""No process of an embedded Ray cluster outlives its driver by more than a few seconds.

Ray ties the processes the driver starts (GCS, raylet, monitors) to the driver's life
(PR_SET_PDEATHSIG), but not the ones the raylet starts: its dashboard and runtime-env agents
outlived a SIGKILLed driver by about two minutes, and a worker busy in a call can too.
`start_reaper(session_dir)` (rl_runtime.cluster.ray_setup, right after an embedded `ray.init`) starts
this file as a small separate process, in a session of its own (a terminal's Ctrl-C does not
reach it): every second it notes the processes of that Ray session (the driver's children whose
command line names the session directory, and all their descendants, each by pid and start
time), and once the driver has exited (however: SIGKILL included) or the session's own
processes are gone (`ray.shutdown`), it SIGKILLs every noted process still running (a pid
reused by another process since is left alone: its start time differs) and exits.

Linux only (it reads /proc); elsewhere `start_reaper` does nothing. Run as a script, it imports
nothing but the standard library.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

TICK_S = 1.0

Proc = tuple[int, int]  # (ppid, start time in clock ticks since boot)


def start_reaper(session_dir: str, driver_pid: int | None = None) -> subprocess.Popen | None:
    """Start the reaper of Ray session `session_dir` for this process (or `driver_pid`); None
    where /proc is missing."""
    if not Path("/proc/self/stat").exists():
        return None
    pid = os.getpid() if driver_pid is None else driver_pid
    return subprocess.Popen(
        [sys.executable, "-S", __file__, str(pid), str(session_dir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def _stat(pid: int) -> Proc | None:
    """(ppid, start time) of `pid`, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _processes() -> dict[int, Proc]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None:
                out[int(name)] = stat
    return out


def session_processes(driver: int, session_dir: str, procs: dict[int, Proc]) -> dict[int, int]:
    """{pid: start time} of the Ray session's processes in `procs`: the driver's children whose
    command line names `session_dir`, and every descendant of those."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _start) in procs.items():
        children.setdefault(ppid, []).append(pid)
    me = os.getpid()  # a child of the driver naming the session too
    roots = [p for p in children.get(driver, []) if p != me and session_dir in _cmdline(p)]
    found: dict[int, int] = {}
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in found or pid not in procs:
            continue
        found[pid] = procs[pid][1]
        stack.extend(children.get(pid, []))
    return found


def _alive(pid: int, start: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[1] == start


def reap(driver: int, session_dir: str, tick_s: float = TICK_S) -> int:
    """Watch the session until the driver exits or the session's processes are gone, then
    SIGKILL what is left of them; the number killed."""
    driver_stat = _stat(driver)
    if driver_stat is None:
        return 0
    driver_start = driver_stat[1]
    try:
        waiter: int | None = os.pidfd_open(driver)  # readable once the driver exits
    except (AttributeError, OSError):
        waiter = None
    noted: dict[int, int] = {}
    seen_session = False
    while _alive(driver, driver_start):
        current = session_processes(driver, session_dir, _processes())
        noted.update(current)
        if current:
            seen_session = True
        elif seen_session:  # ray.shutdown: the session's own processes are gone
            break
        if waiter is not None:
            select.select([waiter], [], [], tick_s)
        else:
            time.sleep(tick_s)
    killed = 0
    for pid, start in noted.items():
        if _alive(pid, start):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its driver decides when it ends
    reap(int(argv[1]), argv[2])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
