"""A fresh run's output directories, cleared of what an earlier run left there, which is kept.

A run that starts fresh (no checkpoint resumed: `resume_from_checkpoint: false`, or `true` with
no checkpoint yet) into directories an earlier run wrote would otherwise append its metrics to
the earlier `metrics.jsonl` (and its TensorBoard events beside the earlier ones), and leave the
earlier checkpoints beside its own, where pruning and a later `resume_from_checkpoint: true` go
by step number and may pick the earlier run's newest. `set_aside_previous_run` moves each of
those into `previous-<UTC time>/` inside the directory it was in, one such directory per
directory, all named for the same moment; nothing is deleted. A resumed run moves nothing (its
metrics go on in the same file).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

PREFIX = "previous-"


def aside_dir(directory: Path, when: datetime) -> Path:
    """`directory/previous-<YYYYmmddTHHMMSSZ>` (UTC), with `-1`, `-2` ... if that exists."""
    stamp = when.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    candidate, n = directory / f"{PREFIX}{stamp}", 0
    while candidate.exists():
        n += 1
        candidate = directory / f"{PREFIX}{stamp}-{n}"
    return candidate


def set_aside_previous_run(paths: Sequence[Path], when: datetime | None = None) -> str | None:
    """Move each of `paths` (files or directories an earlier run wrote) into `previous-<UTC
    time>/` inside its own parent directory (one per parent, one time for all); returns the
    line saying what moved where, None when `paths` is empty."""
    if not paths:
        return None
    when = when or datetime.now(UTC)
    moved: dict[Path, list[str]] = {}
    for path in (Path(os.path.abspath(p)) for p in paths):
        parent = path.parent
        target = next((t for t in moved if t.parent == parent), None)
        if target is None:
            target = aside_dir(parent, when)
            target.mkdir(parents=True)
            moved[target] = []
        os.replace(path, target / path.name)
        moved[target].append(path.name)
    parts = [f"{', '.join(names)} -> {target}/" for target, names in moved.items()]
    return "this run starts fresh; an earlier run's results moved aside: " + "; ".join(parts)
