"""SIGINT and SIGTERM end a run in order, as an exception the run can clean up after.

`handle_interrupts()` (the Runner holds it for the run, the apps' shared main around it) turns
the first SIGINT or SIGTERM the driver's main thread gets into :class:`RunInterrupted`, raised
where that thread is (a wait on the workers included). The Runner then stops its workers and Ray
and writes summary.json with the last durable checkpoint; the apps' main prints that checkpoint
and the command that resumes from it, and exits 130 (SIGINT) or 143 (SIGTERM), without a
traceback. A signal that arrives while the run is already stopping (`stopping()`) is reported
and otherwise ignored: the shutdown it would cut short is what keeps the results.

Ray's `ray.init` installs its own SIGTERM handler in the driver (it kills the local node's
processes and aborts); rl_runtime.cluster.ray_setup puts this one back after it.

The command that resumes a run is the one that started it (`set_command`: the app's main records
its program and arguments) with `resume_from_checkpoint=<checkpoint>` in place of any such key.
"""

from __future__ import annotations

import shlex
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
RESUME_KEY = "resume_from_checkpoint"


class RunInterrupted(BaseException):
    """SIGINT or SIGTERM reached the driver. A BaseException, like KeyboardInterrupt, so that
    no `except Exception` on the way mistakes it for a failure it could handle. The Runner fills
    in where the run stood: `step`, the last durable `checkpoint` (None: none was saved),
    and `resume_command`."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = int(signum)
        self.step: int | None = None
        self.checkpoint: str | None = None
        self.resume_command: str | None = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal ended."""
        return 128 + self.signum

    def report(self) -> str:
        """What the driver prints: where the run stopped, its last durable checkpoint and the
        command that resumes from it (or starts over, when there is none)."""
        where = f" at step {self.step}" if self.step is not None else " before training started"
        lines = [f"interrupted by {self.name}{where}: workers and Ray stopped"]
        if self.checkpoint is not None:
            lines.append(f"last durable checkpoint: {self.checkpoint}")
            if self.resume_command is not None:
                lines.append(f"resume with: {self.resume_command}")
        else:
            lines.append("no checkpoint was saved; a new run starts from the beginning")
        return "\n".join(lines)


_state = threading.local()
_command: tuple[str, ...] | None = None


def _handler(signum: int, frame: Any) -> None:
    if getattr(_state, "stopping", 0):
        print(
            f"{signal.Signals(signum).name} received while the run is stopping: finishing the "
            "shutdown first (SIGKILL forces it, and loses what it would have written)",
            file=sys.stderr,
            flush=True,
        )
        return
    _state.stopping = 1  # only the first signal interrupts
    raise RunInterrupted(signum)


_handler.rl_interrupts = True  # type: ignore[attr-defined]  # rl_runtime.cluster.ray_setup looks for it


def is_ours(handler: Any) -> bool:
    """Whether `handler` (from `signal.getsignal`) is this module's."""
    return bool(getattr(handler, "rl_interrupts", False))


@contextmanager
def handle_interrupts() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise :class:`RunInterrupted` in the main thread
    (the first one; later ones during `stopping()` are reported and ignored). A no-op outside
    the main thread (Python runs signal handlers there only). Nested blocks share the handler;
    the outermost restores what was there before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    outermost = not any(is_ours(h) for h in previous.values())
    if outermost:
        _state.stopping = 0
    for s in SIGNALS:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def stopping() -> Iterator[None]:
    """Within the block (a shutdown), a signal does not interrupt; it is reported."""
    depth = getattr(_state, "stopping", 0)
    _state.stopping = depth + 1
    try:
        yield
    finally:
        _state.stopping = depth


def set_command(program: str, args: Sequence[str]) -> None:
    """Record the command line that started this run (`uv run <program> <args>`), for
    `resume_command`."""
    global _command
    _command = ("uv", "run", program, *args)


def resume_command(checkpoint: str | None) -> str | None:
    """The recorded command with `resume_from_checkpoint=<checkpoint>` (any such argument it had
    replaced); None when no command was recorded or there is no checkpoint."""
    if _command is None or checkpoint is None:
        return None
    args = [a for a in _command if not a.startswith(f"{RESUME_KEY}=")]
    return shlex.join([*args, f"{RESUME_KEY}={checkpoint}"])
