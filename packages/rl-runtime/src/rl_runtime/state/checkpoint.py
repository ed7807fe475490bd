"""A run's checkpoints: rl_train's one layout (:mod:`rl_train.checkpoint_store`: atomic,
signed `step-<N>` directories under a root), with the run state added:

```
step-000010/
  COMMITTED, MANIFEST.json, MANIFEST.hmac   (rl_train.checkpoint_store)
  run_state.json        step, weight_version, env_seed_epoch, RNG states, extra
  actor_train/ critic/ ...                  each role's trainer checkpoint (same layout)
```
`latest()` returns the newest checkpoint that verifies (marker, signature, every file), skipping
and naming newer ones that do not, so a crash mid-save or a tampered directory never loses the
previous one and never runs anything. Older checkpoints are pruned only after the new one is
durable.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rl_train.checkpoint import open_verified
from rl_train.checkpoint_store import MARKER, CheckpointManager, CheckpointSpaceError, dir_step
from rl_train.signing import CheckpointError

__all__ = ["CheckpointSpaceError", "RunCheckpoints", "RunState", "capture_rng", "restore_rng"]

STATE_FILE = "run_state.json"


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


class RunCheckpoints(CheckpointManager):
    """A run's checkpoints under `root`: rl_train's manager, plus the run state in each and the
    meaning of the config's `resume_from_checkpoint`."""

    fault_scope = "run_checkpoint"

    def save_run(self, state: RunState, write: Callable[[Path], None] | None = None) -> Path:
        """Save the checkpoint of `state.step`: `write(tmp_dir)` adds the roles' files, then the
        run state (see `CheckpointManager.save`)."""

        def write_all(tmp: Path) -> None:
            if write is not None:
                write(tmp)
            (tmp / STATE_FILE).write_text(json.dumps(asdict(state)), encoding="utf-8")

        return self.save(state.step, write_all)

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
                f"(step-<N>) or the directory that holds them"
            )
        if dir_step(path) is not None or (path / MARKER).exists():
            self.verify(path)
            return path
        other = RunCheckpoints(path, keep_last=None, key_file=self.key_file)
        return self._latest_or_raise(other, allow_empty=False)

    @staticmethod
    def _latest_or_raise(mgr: RunCheckpoints, *, allow_empty: bool) -> Path | None:
        found = mgr.latest()
        if found is not None or (allow_empty and not mgr.present()):
            return found
        reasons = "; ".join(f"{p.name}: {why}" for p, why in mgr.skipped)
        raise CheckpointError(
            f"resume_from_checkpoint: no valid checkpoint under {mgr.root}"
            + (f" ({reasons})" if reasons else " (none there)")
        )
