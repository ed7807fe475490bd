"""The one checkpoint layout, and its manager: every checkpoint of this stack (a trainer backend's
model/optimizer state, a run's checkpoint that holds one per role plus the run state) is a
directory under a root:

```
root/
  step-000010/            committed checkpoint (renamed into place atomically)
    COMMITTED             marker written last, after every file and directory was fsynced
    MANIFEST.json         size and sha256 of every file below (rl_train.signing)
    MANIFEST.hmac         HMAC-SHA256 of the manifest under a key kept outside `root`
    <the writer's files>
  .tmp-step-000012/       a save in progress or interrupted: never picked, removed by `cleanup()`
```

Directories named `step_<N>` (rl_train's name before there was one layout) are read as the
same step, so checkpoints written then still resume; nothing writes that name any more.

:class:`CheckpointManager` is the single-process view of one root: list, verify, find the newest
that verifies, save atomically, prune and clean up. The collective save of the trainer backends
(:func:`rl_train.checkpoint.begin` / :func:`~rl_train.checkpoint.commit`) uses the same names,
install and pruning from rank 0.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from rl_train.durable import fsync_path, fsync_tree, write_durable
from rl_train.faults import fault_point
from rl_train.signing import CheckpointError, load_key, verify_manifest, write_manifest

log = logging.getLogger(__name__)

MARKER = "COMMITTED"
TMP_PREFIX = ".tmp-"
_OLD_PREFIX = ".old-"
#: leftovers of interrupted saves, this layout's and the earlier `step_<N>` one's
_LEFTOVER_PREFIXES = (TMP_PREFIX, _OLD_PREFIX, ".tmp_step_", ".old_step_")
_STEP_NAME = re.compile(r"step[-_]([0-9]+)")

#: free bytes under which a failed save is taken for a full disk, whatever the writer raised
#: (torch's zip writer says "unexpected pos", not ENOSPC)
FULL_DISK_BYTES = 1 << 20


def step_dir_name(step: int) -> str:
    """The directory name of the checkpoint of ``step``: ``step-000010``."""
    return f"step-{step:06d}"


def dir_step(ckpt: str | os.PathLike[str]) -> int | None:
    """The step a checkpoint directory's name says (``step-<N>``, or the earlier ``step_<N>``),
    or None for any other name (ASCII digits only)."""
    m = _STEP_NAME.fullmatch(Path(ckpt).name)
    return int(m.group(1)) if m else None


class CheckpointSpaceError(OSError):
    """A checkpoint save ran out of disk space (``errno.ENOSPC``); its partial directory was
    removed and earlier checkpoints are intact."""


def free_bytes(path: Path) -> int:
    """Bytes free to this user on ``path``'s filesystem (-1 when it cannot be read)."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return -1
    return stats.f_bavail * stats.f_frsize


def out_of_space(exc: BaseException, root: Path) -> bool:
    """ENOSPC anywhere in ``exc``'s chain (a Ray task error carries it as text), or a disk
    left with less than `FULL_DISK_BYTES` free."""
    seen: BaseException | None = exc
    for _ in range(16):
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return 0 <= free_bytes(root) < FULL_DISK_BYTES


def space_error(exc: BaseException, root: Path, step: int, partial: Path) -> CheckpointSpaceError:
    """The error a save of ``step`` that ran out of space raises (``partial`` already removed)."""
    return CheckpointSpaceError(
        errno.ENOSPC,
        f"no space left on the device of {root} while saving the checkpoint of step {step} "
        f"({free_bytes(root)} bytes free; {exc!r:.300}); the partial {partial.name} was "
        f"removed and earlier checkpoints are intact",
    )


def seal(tmp: Path, step: int, key_file: str | os.PathLike[str] | None) -> None:
    """Make ``tmp`` a complete checkpoint in place: fsync every file and directory, write the
    signed manifest, then the marker, each fsynced (single process; no rename)."""
    key = load_key(key_file, checkpoint_root=tmp.parent)
    fsync_tree(tmp)
    write_manifest(tmp, key, step=step, skip=(MARKER,))
    fault_point("checkpoint.before_marker", step)
    write_durable(tmp / MARKER, json.dumps({"step": step}).encode())
    fsync_path(tmp)


def install(tmp: Path, final: Path) -> None:
    """Rename the sealed ``tmp`` to ``final`` atomically; a checkpoint already there (a step
    saved again) is moved aside first and dropped once the new one is in place."""
    root = final.parent
    if final.exists():
        old = root / f"{_OLD_PREFIX}{final.name}"
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
        os.replace(tmp, final)
        fsync_path(root)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fsync_path(root)


def beyond_kept(
    newest_first: list[Path], keep_last: int, verify_fn: Callable[[Path], object]
) -> list[Path]:
    """What pruning may remove: the checkpoints older than the ``keep_last`` newest that
    ``verify_fn`` accepts (it raises :class:`CheckpointError` otherwise). Newer ones that do not
    verify (a directory someone planted with a large step) count for nothing and are left alone,
    so they never push a real one out."""
    kept = 0
    for i, cand in enumerate(newest_first):
        if kept == keep_last:
            return newest_first[i:]
        try:
            verify_fn(cand)
        except CheckpointError:
            continue
        kept += 1
    return []


class CheckpointManager:
    """The checkpoints under ``root``: saved atomically and signed with the key in ``key_file``
    (default: :func:`rl_train.signing.default_key_file`); ``latest()`` is the newest that
    verifies; only the ``keep_last`` newest valid ones are kept (None: all)."""

    #: names this manager's fault points (``<scope>.after_commit``, rl_train.faults)
    fault_scope = "checkpoint"

    def __init__(
        self,
        root: str | os.PathLike[str],
        keep_last: int | None = 2,
        key_file: str | os.PathLike[str] | None = None,
    ) -> None:
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
        self.root = Path(root)
        self.keep_last = keep_last
        self.key_file = None if key_file is None else str(key_file)
        #: checkpoints the last `latest()` skipped, newest first: (path, reason)
        self.skipped: list[tuple[Path, str]] = []

    def step_dir(self, step: int) -> Path:
        return self.root / step_dir_name(step)

    def tmp_dir(self, step: int) -> Path:
        return self.root / f"{TMP_PREFIX}{step_dir_name(step)}"

    def save(self, step: int, write: Callable[[Path], None] | None = None) -> Path:
        """Write the checkpoint of ``step``: ``write(tmp_dir)`` adds the files; every file and
        directory is fsynced, the signed manifest and the marker written, the directory renamed
        into place and ``root`` fsynced; only then are checkpoints beyond ``keep_last`` removed.
        A failed save leaves no partial directory; a full disk raises
        :class:`CheckpointSpaceError`."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.tmp_dir(step)
        if tmp.exists():
            shutil.rmtree(tmp)
        try:
            tmp.mkdir()
            if write is not None:
                write(tmp)
            seal(tmp, step, self.key_file)
        except BaseException as exc:  # a partial checkpoint is removed; the earlier ones stay
            shutil.rmtree(tmp, ignore_errors=True)
            if out_of_space(exc, self.root):
                raise space_error(exc, self.root, step, tmp) from exc
            raise
        final = self.step_dir(step)
        install(tmp, final)
        fault_point(f"{self.fault_scope}.after_commit", step)
        self.prune()
        return final

    def present(self) -> list[Path]:
        """Every checkpoint directory under ``root`` (complete or not), oldest first; of two
        names for one step, this layout's comes last (preferred)."""
        if not self.root.is_dir():
            return []
        found = []
        for p in self.root.iterdir():
            step = dir_step(p)
            if step is not None and p.is_dir():
                found.append((step, p.name == step_dir_name(step), p))
        return [p for *_key, p in sorted(found)]

    def complete(self) -> list[Path]:
        """Committed checkpoints (marker present, not yet verified), oldest first."""
        return [p for p in self.present() if (p / MARKER).is_file()]

    def verify(self, ckpt: str | os.PathLike[str], *, hashes: bool = True) -> dict[str, str]:
        """Raise :class:`CheckpointError` naming the first problem of checkpoint directory
        ``ckpt`` (no marker, a symlink, an unsigned, wrongly signed or malformed manifest, one
        signed for another step than its name says, a missing/truncated/corrupt/unlisted file);
        returns ``{relative path: sha256}`` of its files. Reads no pickle."""
        path = Path(ckpt)
        if not path.is_dir():
            raise CheckpointError(f"checkpoint {path} does not exist")
        if not (path / MARKER).is_file():
            raise CheckpointError(f"checkpoint {path} has no {MARKER} marker (incomplete save)")
        return verify_manifest(
            path,
            load_key(self.key_file, checkpoint_root=self.root),
            step=dir_step(path),
            hashes=hashes,
            skip=(MARKER,),
        )

    def latest(self) -> Path | None:
        """The newest checkpoint that verifies; newer ones that do not are logged and kept in
        ``self.skipped`` with the reason."""
        self.skipped = []
        for path in reversed(self.present()):
            try:
                self.verify(path)
            except CheckpointError as err:
                self.skipped.append((path, str(err)))
                log.warning("skipping checkpoint %s: %s", path.name, err)
                continue
            return path
        return None

    def cleanup(self) -> None:
        """Remove leftovers of interrupted saves."""
        if not self.root.is_dir():
            return
        for p in self.root.iterdir():
            if p.is_dir() and p.name.startswith(_LEFTOVER_PREFIXES):
                shutil.rmtree(p, ignore_errors=True)

    def prune(self) -> None:
        """Remove the checkpoints older than the ``keep_last`` newest that verify."""
        if self.keep_last is None:
            return
        sizes_only = functools.partial(self.verify, hashes=False)
        for p in beyond_kept(self.complete()[::-1], self.keep_last, sizes_only):
            shutil.rmtree(p, ignore_errors=True)
