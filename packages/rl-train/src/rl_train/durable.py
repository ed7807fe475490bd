"""Durability on a POSIX filesystem: a file's bytes and a directory's entries reach the disk only
after ``fsync``; a commit marker is worth something only if everything before it was synced."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: Path) -> None:
    """fsync one file or directory (directories: where the platform allows opening them)."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() and hasattr(os, "O_DIRECTORY") else 0)
    try:
        fd = os.open(path, flags)
    except IsADirectoryError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> int:
    """fsync every file under ``root``, then every directory bottom-up (``root`` last), so each
    file's data and each name are on disk. Symlinks are not followed. Returns the file count."""
    count = 0
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False, followlinks=False):
        here = Path(dirpath)
        for name in filenames:
            p = here / name
            if not p.is_symlink():
                fsync_path(p)
                count += 1
        fsync_path(here)
    return count


def write_durable(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it (the caller fsyncs the directory)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
