"""Atomic checkpoint directories: write into ``root/.tmp_step_<N>``, record a manifest (size and
sha256 of every file), write the ``COMMITTED`` marker, then rename to ``root/step_<N>``.

A directory without the marker (a crash mid-save) is never picked. Loading verifies the manifest,
names the first missing/truncated/corrupt file and falls back to the previous complete checkpoint.
Every function here is collective-safe: rank 0 does the filesystem work, the others wait.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rl_train import dist as rdist

log = logging.getLogger(__name__)

MARKER = "COMMITTED"
MANIFEST = "MANIFEST.json"
_STEP_RE = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete or corrupt; the message names the directory and the file."""


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def begin(root: str | Path, step: int) -> Path:
    """Create a fresh temporary directory for ``step`` (collective); returns its path."""
    root = Path(root)
    tmp = root / f".tmp_{step_dir_name(step)}"
    if rdist.rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    rdist.barrier()
    return tmp


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_manifest(ckpt: Path) -> dict[str, dict[str, Any]]:
    files = {}
    for path in sorted(p for p in ckpt.rglob("*") if p.is_file()):
        rel = path.relative_to(ckpt).as_posix()
        if rel in (MANIFEST, MARKER):
            continue
        files[rel] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    (ckpt / MANIFEST).write_text(json.dumps({"files": files}, indent=1))
    return files


def commit(root: str | Path, step: int, tmp: Path, *, keep_last: int | None = None) -> Path:
    """Seal ``tmp`` as ``root/step_<N>`` (collective: call after every rank finished writing)."""
    root = Path(root)
    final = root / step_dir_name(step)
    rdist.barrier()
    if rdist.rank() == 0:
        write_manifest(tmp)
        marker = tmp / MARKER
        with open(marker, "w") as f:
            f.write(json.dumps({"step": step}))
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if final.exists():  # re-saving a step: move the old one aside, then drop it
            old = root / f".old_{final.name}"
            if old.exists():
                shutil.rmtree(old)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(root)
        if keep_last:
            for stale in committed_checkpoints(root)[keep_last:]:
                shutil.rmtree(stale, ignore_errors=True)
    rdist.barrier()
    return final


def committed_checkpoints(root: str | Path) -> list[Path]:
    """Committed ``step_<N>`` directories under ``root``, newest step first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _STEP_RE.match(child.name)
        if m and child.is_dir() and (child / MARKER).is_file():
            found.append((int(m.group(1)), child))
    return [p for _, p in sorted(found, reverse=True)]


def latest_checkpoint(root: str | Path) -> Path | None:
    found = committed_checkpoints(root)
    return found[0] if found else None


def verify(ckpt: str | Path, *, hashes: bool = True) -> None:
    """Raise :class:`CheckpointError` naming the first problem of checkpoint directory ``ckpt``."""
    ckpt = Path(ckpt)
    if not ckpt.is_dir():
        raise CheckpointError(f"checkpoint {ckpt} does not exist")
    if not (ckpt / MARKER).is_file():
        raise CheckpointError(f"checkpoint {ckpt} has no {MARKER} marker (incomplete save)")
    manifest_path = ckpt / MANIFEST
    try:
        files = json.loads(manifest_path.read_text())["files"]
    except (OSError, ValueError, KeyError) as err:
        raise CheckpointError(f"checkpoint {ckpt}: unreadable {MANIFEST}: {err}") from None
    for rel, meta in files.items():
        path = ckpt / rel
        if not path.is_file():
            raise CheckpointError(f"checkpoint {ckpt}: missing file {rel}")
        size = path.stat().st_size
        if size != meta["bytes"]:
            raise CheckpointError(
                f"checkpoint {ckpt}: file {rel} has {size} bytes, manifest says {meta['bytes']} "
                "(truncated or overwritten)"
            )
        if hashes and _sha256(path) != meta["sha256"]:
            raise CheckpointError(f"checkpoint {ckpt}: file {rel} fails its sha256 check (corrupt)")


@dataclass
class LoadReport:
    """Which checkpoint was loaded and which newer ones were rejected (path, reason)."""

    loaded: Path | None = None
    rejected: list[tuple[Path, str]] = field(default_factory=list)


def load_newest_valid(
    root_or_ckpt: str | Path, load_fn: Callable[[Path], Any], *, hashes: bool = True
) -> tuple[Any, LoadReport]:
    """Verify candidates newest first (rank 0 decides, all ranks agree) and ``load_fn`` the first
    complete one. ``root_or_ckpt`` is a root of ``step_<N>`` dirs or one checkpoint dir."""
    target = Path(root_or_ckpt)
    candidates = (
        [target]
        if (target / MARKER).exists() or _STEP_RE.match(target.name)
        else committed_checkpoints(target)
    )
    report = LoadReport()
    chosen = -1
    reasons: list[str] = []
    if rdist.rank() == 0:
        for i, cand in enumerate(candidates):
            try:
                verify(cand, hashes=hashes)
            except CheckpointError as err:
                reasons.append(str(err))
                log.warning("skipping checkpoint: %s", err)
                continue
            chosen = i
            break
    if rdist.is_dist() and rdist.world_size() > 1:
        import torch.distributed as dist

        box: list[Any] = [chosen, reasons]
        dist.broadcast_object_list(box, src=0)
        chosen, reasons = box[0], box[1]
    report.rejected = [(candidates[i], r) for i, r in enumerate(reasons)]
    if chosen < 0:
        detail = "; ".join(reasons) if reasons else "no committed step_<N> directory"
        raise CheckpointError(f"no complete checkpoint under {target}: {detail}")
    report.loaded = candidates[chosen]
    return load_fn(candidates[chosen]), report


# -- RNG state of this rank ------------------------------------------------------------------------
def capture_rng(device_kind: str | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    try:
        import numpy as np

        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
        state["numpy"] = (
            name,
            torch.from_numpy(keys.astype("int64")),
            int(pos),
            int(has_gauss),
            float(cached),
        )
    except ImportError:
        pass
    if device_kind and device_kind != "cpu":
        state["device"] = torch.get_device_module(device_kind).get_rng_state()
    return state


def restore_rng(state: dict[str, Any], device_kind: str | None = None) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if device_kind and device_kind != "cpu" and "device" in state:
        torch.get_device_module(device_kind).set_rng_state(state["device"])


def save_rng(ckpt: Path, device_kind: str | None) -> None:
    torch.save(capture_rng(device_kind), ckpt / f"rng_rank{rdist.rank()}.pt")


def load_rng(ckpt: Path, device_kind: str | None) -> None:
    path = ckpt / f"rng_rank{rdist.rank()}.pt"
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {ckpt}: missing file {path.name} for rank {rdist.rank()}"
        )
    restore_rng(torch.load(path, weights_only=True), device_kind)


def save_json(path: Path, data: dict[str, Any]) -> None:
    if rdist.rank() == 0:
        path.write_text(json.dumps(data, indent=1, sort_keys=True))


def load_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path.parent}: unreadable {path.name}: {err}") from None
