"""One run per output directory (and per checkpoint directory): exclusive locks held for the
run's life.

Two runs pointed at the same `output_dir` (the same command started twice) would move each
other's results aside, interleave their checkpoints and append to one metrics.jsonl; two runs with
different output dirs but one `checkpoint_config.output_dir` outside them would still interleave
their checkpoints. The Runner holds `run_directories_lock(output_dir, checkpoint_dir)` from before
it touches either directory until teardown: an `fcntl.flock` on `<directory>/.run.lock` (which
holds the holder's pid) for the output directory, and for the checkpoint directory when it is not
inside it. The OS drops a lock when the holding process exits, crashes or is killed, so a stale
lock file never blocks a later run; a second run fails at once with `RunDirectoryInUseError`
naming the directory and the pid."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = ".run.lock"
"""The lock file inside the run's output directory (never moved aside, never removed)."""


class RunDirectoryInUseError(RuntimeError):
    """Another live process holds the lock of the run directory."""


@contextlib.contextmanager
def run_directories_lock(
    output_dir: str | os.PathLike[str], *more: str | os.PathLike[str]
) -> Iterator[list[Path]]:
    """Hold the locks of `output_dir` and of each directory of `more` that is not inside it
    (a checkpoint directory configured elsewhere) while the block runs; yields the lock files'
    paths. Raises `RunDirectoryInUseError` at once when another process holds any of them, and
    then holds none."""
    with contextlib.ExitStack() as held:
        yield [
            held.enter_context(run_directory_lock(directory))
            for directory in directories_to_lock(output_dir, *more)
        ]


def directories_to_lock(
    output_dir: str | os.PathLike[str], *more: str | os.PathLike[str]
) -> list[Path]:
    """`output_dir`, then each of `more` (resolved) not inside a directory already listed."""
    locked: list[Path] = []
    for directory in (output_dir, *more):
        path = Path(directory).resolve()
        if not any(path.is_relative_to(held) for held in locked):
            locked.append(path)
    return locked


@contextlib.contextmanager
def run_directory_lock(directory: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold the exclusive lock of run directory `directory` (created if missing) while the
    block runs; yields the lock file's path. Raises `RunDirectoryInUseError` at once when
    another process holds it."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    lock_file = path / LOCK_NAME
    # O_NOFOLLOW: a symlink planted under the name is an error, not a file elsewhere truncated
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            raise RunDirectoryInUseError(
                f"run directory {path.resolve()} is in use by another run "
                f"(pid {_holder(fd)}, lock {lock_file}); wait for it to finish or give this run "
                "another output_dir (or checkpoint_config.output_dir)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield lock_file
    finally:
        os.close(fd)  # releases the lock (the OS does the same if the process dies)


def _holder(fd: int) -> str:
    """The pid the holder wrote ("unknown" while it is still writing it)."""
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return text if text.isdigit() else "unknown"
