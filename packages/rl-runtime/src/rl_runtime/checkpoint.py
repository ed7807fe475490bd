"""Atomic checkpoints of a run: model/optimizer files plus the run state needed to resume.

Layout under `root`:
```
step-000010/            committed checkpoint (renamed into place atomically)
  COMMITTED             marker written last, after every file was flushed
  run_state.json        step, weight_version, env_seed_epoch, RNG states, extra
  <files written by the caller's `write(dir)`: actor/, critic/, hf/ ...>
.tmp-step-000012-<pid>/ an interrupted save: ignored by `latest()`, removed by `cleanup()`
```
`latest()` returns the newest complete checkpoint, so a crash mid-save never loses the previous one.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

COMMIT_MARKER = "COMMITTED"
STATE_FILE = "run_state.json"
_PREFIX = "step-"


@dataclass
class RunState:
    """Everything besides model files needed to continue a run as if uninterrupted."""

    step: int
    weight_version: int
    env_seed_epoch: int
    rng: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def capture_rng() -> dict[str, Any]:
    """Python, numpy and torch (CPU) RNG states as JSON-safe data."""
    import numpy as np
    import torch

    py_version, py_state, py_gauss = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [
            np_state[0],
            [int(x) for x in np_state[1]],  # type: ignore[index]
            int(np_state[2]),  # type: ignore[index]
            int(np_state[3]),  # type: ignore[index]
            float(np_state[4]),  # type: ignore[index]
        ],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of `capture_rng`."""
    import numpy as np
    import torch

    py_version, py_state, py_gauss = state["python"]
    random.setstate((py_version, tuple(py_state), py_gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    raw = base64.b64decode(state["torch"])
    torch.set_rng_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointManager:
    """Saves checkpoints atomically under `root` and finds the latest complete one."""

    def __init__(self, root: str | os.PathLike[str], keep_last: int | None = 2) -> None:
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
        self.root = Path(root)
        self.keep_last = keep_last

    def step_dir(self, step: int) -> Path:
        return self.root / f"{_PREFIX}{step:06d}"

    def save(
        self,
        state: RunState,
        write: Callable[[Path], None] | None = None,
    ) -> Path:
        """Write a checkpoint for `state.step`: `write(tmp_dir)` adds the model files, then the run
        state and the commit marker are written and the directory is renamed into place."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{_PREFIX}{state.step:06d}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        if write is not None:
            write(tmp)
        with (tmp / STATE_FILE).open("w", encoding="utf-8") as f:
            json.dump(asdict(state), f)
            f.flush()
            os.fsync(f.fileno())
        with (tmp / COMMIT_MARKER).open("w", encoding="utf-8") as f:
            f.write(f"{state.step}\n")
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        final = self.step_dir(state.step)
        if final.exists():
            trash = self.root / f".old-{final.name}-{os.getpid()}"
            os.replace(final, trash)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(self.root)
        self._prune()
        return final

    def complete(self) -> list[Path]:
        """Committed checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        found = []
        for p in self.root.iterdir():
            if p.is_dir() and p.name.startswith(_PREFIX) and (p / COMMIT_MARKER).is_file():
                try:
                    found.append((int(p.name[len(_PREFIX) :]), p))
                except ValueError:
                    continue
        return [p for _s, p in sorted(found)]

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    @staticmethod
    def load_state(ckpt_dir: str | os.PathLike[str]) -> RunState:
        path = Path(ckpt_dir)
        if not (path / COMMIT_MARKER).is_file():
            raise FileNotFoundError(
                f"{path} is not a complete checkpoint (no {COMMIT_MARKER} marker); "
                f"an interrupted save is never resumed from"
            )
        try:
            data = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
            return RunState(**data)
        except (OSError, json.JSONDecodeError, TypeError) as exc:
            raise ValueError(f"{path / STATE_FILE}: unreadable run state: {exc}") from exc

    def resolve(self, resume_from_checkpoint: bool | str | None) -> Path | None:
        """Map the config's `resume_from_checkpoint` (false / true = latest here / a path) to a
        checkpoint dir, or None to start fresh."""
        if resume_from_checkpoint in (None, False, "", "false", "False"):
            return None
        if resume_from_checkpoint is True or resume_from_checkpoint in ("true", "True", "latest"):
            return self.latest()
        path = Path(str(resume_from_checkpoint))
        if (path / COMMIT_MARKER).is_file():
            return path
        latest = CheckpointManager(path, keep_last=None).latest()
        if latest is None:
            raise FileNotFoundError(
                f"resume_from_checkpoint={resume_from_checkpoint!r}: no complete checkpoint there"
            )
        return latest

    def cleanup(self) -> None:
        """Remove leftovers of interrupted saves."""
        if not self.root.is_dir():
            return
        for p in self.root.iterdir():
            if p.is_dir() and (p.name.startswith(".tmp-") or p.name.startswith(".old-")):
                shutil.rmtree(p, ignore_errors=True)

    def _prune(self) -> None:
        if self.keep_last is None:
            return
        done = self.complete()
        for p in done[: max(0, len(done) - self.keep_last)]:
            shutil.rmtree(p, ignore_errors=True)
