"""Collective checkpoint saves and loads of the trainer backends, in the one layout of
:mod:`rl_train.checkpoint_store` (``root/step-<N>``, written as ``root/.tmp-step-<N>``): every
file is fsynced, the manifest (size and sha256 of every file) signed with HMAC-SHA256 under a key
kept outside the directory (:mod:`rl_train.signing`), then the ``COMMITTED`` marker, then the
rename, and only then are older checkpoints pruned.

A directory without the marker (a crash mid-save) is never picked. Loading verifies the signature
and every file BEFORE anything in the directory is unpickled, names the first missing, truncated,
corrupt, unlisted or unsigned file and falls back to the previous complete checkpoint. Every
function here is collective-safe: rank 0 does the filesystem work, the others wait.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch

from rl_train import dist as rdist
from rl_train.checkpoint_store import (
    MARKER,
    CheckpointManager,
    CheckpointSpaceError,
    dir_step,
    install,
    out_of_space,
    seal,
    space_error,
    step_dir_name,
)
from rl_train.faults import fault_point
from rl_train.signing import CheckpointError

log = logging.getLogger(__name__)

__all__ = [
    "MARKER",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointSpaceError",
    "LoadReport",
    "begin",
    "commit",
    "committed_checkpoints",
    "dir_step",
    "latest_checkpoint",
    "load_newest_valid",
    "open_verified",
    "step_dir_name",
    "verify",
]


def begin(root: str | Path, step: int) -> Path:
    """Create a fresh temporary directory for ``step`` (collective); returns its path."""
    store = CheckpointManager(root, keep_last=None)
    tmp = store.tmp_dir(step)
    if rdist.rank() == 0:
        store.root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    rdist.barrier()
    return tmp


def commit(
    root: str | Path,
    step: int,
    tmp: Path,
    *,
    keep_last: int | None = None,
    key_file: str | os.PathLike[str] | None = None,
) -> Path:
    """Seal ``tmp`` as ``root/step-<N>`` (collective: call after every rank finished writing).
    Older checkpoints beyond ``keep_last`` are removed only once the new one is durable. A full
    disk removes ``tmp`` and raises :class:`CheckpointSpaceError` on rank 0."""
    store = CheckpointManager(root, keep_last=keep_last, key_file=key_file)
    final = store.step_dir(step)
    rdist.barrier()
    if rdist.rank() == 0:
        try:
            seal(tmp, step, key_file)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if out_of_space(exc, store.root):
                raise space_error(exc, store.root, step, tmp) from exc
            raise
        install(tmp, final)
        fault_point("checkpoint.after_commit", step)
        store.prune()
    rdist.barrier()
    return final


def committed_checkpoints(root: str | Path) -> list[Path]:
    """Committed checkpoint directories under ``root``, newest step first (not yet verified)."""
    return CheckpointManager(root, keep_last=None).complete()[::-1]


def latest_checkpoint(
    root: str | Path, *, key_file: str | os.PathLike[str] | None = None
) -> Path | None:
    """The newest committed checkpoint under ``root`` that :func:`verify` accepts (others are
    logged, naming the problem), or None."""
    return CheckpointManager(root, keep_last=None, key_file=key_file).latest()


def verify(
    ckpt: str | Path, *, hashes: bool = True, key_file: str | os.PathLike[str] | None = None
) -> dict[str, str]:
    """Raise :class:`CheckpointError` naming the first problem of checkpoint directory ``ckpt``
    (see :meth:`CheckpointManager.verify`); returns ``{relative path: sha256}`` of its files."""
    ckpt = Path(ckpt)
    return CheckpointManager(ckpt.parent, keep_last=None, key_file=key_file).verify(
        ckpt, hashes=hashes
    )


@dataclass
class LoadReport:
    """Which checkpoint was loaded, the sha256 of its verified files, and which newer ones were
    rejected (path, reason)."""

    loaded: Path | None = None
    rejected: list[tuple[Path, str]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)


def load_newest_valid(
    root_or_ckpt: str | Path,
    load_fn: Callable[[Path, LoadReport], Any],
    *,
    hashes: bool = True,
    key_file: str | os.PathLike[str] | None = None,
) -> tuple[Any, LoadReport]:
    """Verify candidates newest first (rank 0 decides, all ranks agree) and ``load_fn`` the first
    complete one; ``report.files`` (every rank) holds the verified hashes, for
    :func:`open_verified`. ``root_or_ckpt`` is a root of ``step-<N>`` dirs or one checkpoint dir."""
    target = Path(root_or_ckpt)
    candidates = (
        [target]
        if (target / MARKER).exists() or dir_step(target) is not None
        else committed_checkpoints(target)
    )
    report = LoadReport()
    chosen = -1
    reasons: list[str] = []
    files: dict[str, str] = {}
    if rdist.rank() == 0:
        for i, cand in enumerate(candidates):
            try:
                files = verify(cand, hashes=hashes, key_file=key_file)
            except CheckpointError as err:
                reasons.append(str(err))
                log.warning("skipping checkpoint: %s", err)
                continue
            chosen = i
            break
    if rdist.is_dist() and rdist.world_size() > 1:
        import torch.distributed as dist

        box: list[Any] = [chosen, reasons, files]
        dist.broadcast_object_list(box, src=0)
        chosen, reasons, files = box[0], box[1], box[2]
    report.rejected = [(candidates[i], r) for i, r in enumerate(reasons)]
    if chosen < 0:
        detail = "; ".join(reasons) if reasons else "no committed step-<N> directory"
        raise CheckpointError(f"no complete checkpoint under {target}: {detail}")
    report.loaded = candidates[chosen]
    report.files = files
    return load_fn(candidates[chosen], report), report


@contextmanager
def open_verified(ckpt: Path, path: Path, files: dict[str, str]) -> Iterator[IO[bytes]]:
    """Open ``path`` (inside checkpoint ``ckpt``), hash it through the open descriptor, and yield
    it rewound only if the hash is the verified one: a file swapped after verification is never
    read. ``files`` is :attr:`LoadReport.files`."""
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(ckpt))
    expected = files.get(Path(rel).as_posix())
    if expected is None:
        raise CheckpointError(f"checkpoint {ckpt}: file {rel} is not in the verified manifest")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as err:
        raise CheckpointError(f"checkpoint {ckpt}: cannot open file {rel}: {err}") from None
    with os.fdopen(fd, "rb") as f:
        h = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
        if h.hexdigest() != expected:
            raise CheckpointError(f"checkpoint {ckpt}: file {rel} changed after verification")
        f.seek(0)
        yield f


# -- RNG state of this rank ------------------------------------------------------------------------
def capture_rng(device_kind: str | None = None) -> dict[str, Any]:
    """torch (CPU), python, numpy (legacy global) and device RNG states of this process."""
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


def load_rng(ckpt: Path, device_kind: str | None, files: dict[str, str]) -> None:
    path = ckpt / f"rng_rank{rdist.rank()}.pt"
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {ckpt}: missing file {path.name} for rank {rdist.rank()}"
        )
    with open_verified(ckpt, path, files) as f:
        restore_rng(torch.load(f, weights_only=True), device_kind)


def save_json(path: Path, data: dict[str, Any]) -> None:
    if rdist.rank() == 0:
        path.write_text(json.dumps(data, indent=1, sort_keys=True))


def load_json(path: Path, files: dict[str, str]) -> dict[str, Any]:
    try:
        with open_verified(path.parent, path, files) as f:
            return json.loads(f.read())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path.parent}: unreadable {path.name}: {err}") from None
