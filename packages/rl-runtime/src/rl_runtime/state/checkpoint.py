"""Atomic, signed checkpoints of a run: model/optimizer files plus the run state needed to resume.

Layout under `root`:
```
step-000010/            committed checkpoint (renamed into place atomically)
  COMMITTED             marker written last, after every file and directory was fsynced
  MANIFEST.json         size and sha256 of every file below (rl_train.signing)
  MANIFEST.hmac         HMAC-SHA256 of the manifest under a key kept outside `root`
  run_state.json        step, weight_version, env_seed_epoch, RNG states, extra
  <files written by the caller's `write(dir)`: actor_train/, critic/ ...>
.tmp-step-000012-<pid>/ an interrupted save: ignored by `latest()`, removed by `cleanup()`
```
`latest()` returns the newest checkpoint that verifies (marker, signature, every file), skipping
and naming newer ones that do not, so a crash mid-save or a tampered directory never loses the
previous one and never runs anything. Older checkpoints are pruned only after the new one is
durable.
"""

from __future__ import annotations

import base64
import errno
import functools
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rl_train.checkpoint import MARKER, beyond_kept, open_verified, seal
from rl_train.durable import fsync_path
from rl_train.faults import fault_point
from rl_train.signing import CheckpointError, load_key, step_of_dir, verify_manifest

log = logging.getLogger(__name__)

COMMIT_MARKER = MARKER
STATE_FILE = "run_state.json"
_SEP = "-"
_PREFIX = f"step{_SEP}"


@dataclass
class RunState:
    """Everything besides model files needed to continue a run as if uninterrupted."""

    step: int
    weight_version: int
    env_seed_epoch: int
    rng: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def capture_rng() -> dict[str, Any]:
    """This process's python, numpy and torch (CPU) RNG states (rl_train.checkpoint.capture_rng,
    the one capture) as JSON-safe data."""
    from rl_train.checkpoint import capture_rng as capture

    state = capture()
    py_version, py_state, py_gauss = state["python"]
    name, keys, pos, has_gauss, cached = state["numpy"]
    return {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [name, [int(x) for x in keys.tolist()], pos, has_gauss, cached],
        "torch": base64.b64encode(state["torch"].numpy().tobytes()).decode("ascii"),
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of `capture_rng` (rl_train.checkpoint.restore_rng, the one restore)."""
    import torch

    from rl_train.checkpoint import restore_rng as restore

    py_version, py_state, py_gauss = state["python"]
    name, keys, pos, has_gauss, cached = state["numpy"]
    raw = base64.b64decode(state["torch"])
    restore({
        "torch": torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone(),
        "python": (py_version, tuple(py_state), py_gauss),
        "numpy": (name, torch.tensor(keys, dtype=torch.int64), pos, has_gauss, cached),
    })  # fmt: skip


class CheckpointSpaceError(OSError):
    """A checkpoint save ran out of disk space (``errno.ENOSPC``); its partial directory was
    removed."""


#: free bytes under which a failed save is taken for a full disk, whatever the writer raised
#: (torch's zip writer says "unexpected pos", not ENOSPC)
FULL_DISK_BYTES = 1 << 20


def _free_bytes(path: Path) -> int:
    try:
        stats = os.statvfs(path)
    except OSError:
        return -1
    return stats.f_bavail * stats.f_frsize


def _out_of_space(exc: BaseException, root: Path) -> bool:
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
    return 0 <= _free_bytes(root) < FULL_DISK_BYTES


class CheckpointManager:
    """Saves checkpoints atomically under `root`, signed with the key in `key_file` (default:
    `rl_train.signing.default_key_file()`), and finds the newest one that verifies."""

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
        return self.root / f"{_PREFIX}{step:06d}"

    def save(
        self,
        state: RunState,
        write: Callable[[Path], None] | None = None,
    ) -> Path:
        """Write a checkpoint for `state.step`: `write(tmp_dir)` adds the model files, then the run
        state; every file and directory is fsynced, the signed manifest and the commit marker are
        written (fsynced), the directory is renamed into place and `root` fsynced; only then are
        checkpoints beyond `keep_last` removed."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{_PREFIX}{state.step:06d}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        try:
            tmp.mkdir()
            if write is not None:
                write(tmp)
            (tmp / STATE_FILE).write_text(json.dumps(asdict(state)), encoding="utf-8")
            seal(tmp, state.step, self.key_file)
        except BaseException as exc:  # a partial checkpoint is removed; the earlier ones stay
            shutil.rmtree(tmp, ignore_errors=True)
            if _out_of_space(exc, self.root):
                raise CheckpointSpaceError(
                    errno.ENOSPC,
                    f"no space left on the device of {self.root} while saving the checkpoint of "
                    f"step {state.step} ({_free_bytes(self.root)} bytes free; {exc!r:.300}); "
                    f"the partial {tmp.name} was removed and earlier checkpoints are intact",
                ) from exc
            raise
        final = self.step_dir(state.step)
        if final.exists():
            trash = self.root / f".old-{final.name}-{os.getpid()}"
            os.replace(final, trash)
            os.replace(tmp, final)
            fsync_path(self.root)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_path(self.root)
        fault_point("run_checkpoint.after_commit", state.step)
        self._prune()
        return final

    def present(self) -> list[Path]:
        """Every `step-<N>` directory under `root` (complete or not), oldest first."""
        if not self.root.is_dir():
            return []
        found = []
        for p in self.root.iterdir():
            step = step_of_dir(p.name, _SEP)
            if step is not None and p.is_dir():
                found.append((step, p))
        return [p for _s, p in sorted(found)]

    def complete(self) -> list[Path]:
        """Committed checkpoints (marker present, not yet verified), oldest first."""
        return [p for p in self.present() if (p / COMMIT_MARKER).is_file()]

    def verify(self, ckpt_dir: str | os.PathLike[str], *, hashes: bool = True) -> dict[str, str]:
        """Raise `CheckpointError` naming the first problem of `ckpt_dir` (no marker, a symlink,
        an unsigned, wrongly signed or malformed manifest, one signed for another step than the
        name `step-<N>` says, missing/truncated/corrupt/unlisted file); returns the verified
        `{relative path: sha256}`. Reads no pickle."""
        path = Path(ckpt_dir)
        if not path.is_dir():
            raise CheckpointError(f"checkpoint {path} does not exist")
        if not (path / COMMIT_MARKER).is_file():
            raise CheckpointError(
                f"checkpoint {path} has no {COMMIT_MARKER} marker (interrupted save)"
            )
        return verify_manifest(
            path,
            load_key(self.key_file, checkpoint_root=self.root),
            step=step_of_dir(path.name, _SEP),
            hashes=hashes,
            skip=(COMMIT_MARKER,),
        )

    def latest(self) -> Path | None:
        """The newest checkpoint that verifies; newer ones that do not are logged and kept in
        `self.skipped` with the reason."""
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

    def load_state(self, ckpt_dir: str | os.PathLike[str]) -> RunState:
        """The run state of a checkpoint whose signed manifest verifies (sizes; the file itself is
        hashed as it is read)."""
        path = Path(ckpt_dir)
        files = self.verify(path, hashes=False)
        try:
            with open_verified(path, path / STATE_FILE, files) as f:
                data = json.loads(f.read())
            return RunState(**data)
        except (OSError, json.JSONDecodeError, TypeError) as exc:
            raise CheckpointError(f"{path / STATE_FILE}: unreadable run state: {exc}") from exc

    def resolve(self, resume_from_checkpoint: bool | str | None) -> Path | None:
        """Map the config's `resume_from_checkpoint` (false / true = latest here / a path) to a
        verified checkpoint dir, or None to start fresh. `true` starts fresh only when `root`
        holds no `step-<N>` directory at all; checkpoints that are all invalid are an error naming
        each and why."""
        if resume_from_checkpoint in (None, False, "", "false", "False"):
            return None
        if resume_from_checkpoint is True or resume_from_checkpoint in ("true", "True", "latest"):
            return self._latest_or_raise(self, allow_empty=True)
        path = Path(str(resume_from_checkpoint))
        if path.exists() and not path.is_dir():
            raise CheckpointError(
                f"resume_from_checkpoint: {path} is a file; give a checkpoint directory "
                f"({_PREFIX}<N>) or the directory that holds them"
            )
        if path.name.startswith(_PREFIX) or (path / COMMIT_MARKER).exists():
            self.verify(path)
            return path
        other = CheckpointManager(path, keep_last=None, key_file=self.key_file)
        return self._latest_or_raise(other, allow_empty=False)

    @staticmethod
    def _latest_or_raise(mgr: CheckpointManager, *, allow_empty: bool) -> Path | None:
        found = mgr.latest()
        if found is not None or (allow_empty and not mgr.present()):
            return found
        reasons = "; ".join(f"{p.name}: {why}" for p, why in mgr.skipped)
        raise CheckpointError(
            f"resume_from_checkpoint: no valid checkpoint under {mgr.root}"
            + (f" ({reasons})" if reasons else " (none there)")
        )

    def cleanup(self) -> None:
        """Remove leftovers of interrupted saves."""
        if not self.root.is_dir():
            return
        for p in self.root.iterdir():
            if p.is_dir() and (p.name.startswith(".tmp-") or p.name.startswith(".old-")):
                shutil.rmtree(p, ignore_errors=True)

    def _prune(self) -> None:
        """Remove the checkpoints older than the `keep_last` newest that verify."""
        if self.keep_last is None:
            return
        newest_first = self.complete()[::-1]
        sizes_only = functools.partial(self.verify, hashes=False)
        for p in beyond_kept(newest_first, self.keep_last, sizes_only):
            shutil.rmtree(p, ignore_errors=True)
