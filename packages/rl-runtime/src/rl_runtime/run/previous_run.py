"""A fresh run's output directories, cleared of what an earlier run left there, which is kept.

A run that starts fresh (no checkpoint resumed: `resume_from_checkpoint: false`, or `true` with
no checkpoint yet) into directories an earlier run wrote would otherwise append its metrics to
the earlier `metrics.jsonl` (and its TensorBoard events beside the earlier ones), and leave the
earlier checkpoints beside its own, where pruning and a later `resume_from_checkpoint: true` go
by step number and may pick the earlier run's newest; and it would overwrite the earlier
`RUN_OUTPUTS` in output_dir (summary.json, curves.png, resolved_config.yaml, hf_model/), and any
file an app writes for the run (apps/async's summary.json of both runs). `set_aside_previous_run`
moves each of those into `previous-<UTC time>/` inside the directory it was in, one such
directory per directory, all named for the same moment; nothing is deleted. A resumed run moves
nothing (its metrics go on in the same file, its outputs are rewritten at its end).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from rl_config.redact import DUMP_NAME

PREFIX = "previous-"
SUMMARY_NAME = "summary.json"
CURVES_NAME = "curves.png"
HF_MODEL_NAME = "hf_model"
RUN_OUTPUTS = (SUMMARY_NAME, CURVES_NAME, DUMP_NAME, HF_MODEL_NAME)
"""What rl_runtime.run.runner writes into output_dir (the resolved config through
rl_config.redact.dump_resolved, hf_model/ with `export_hf`)."""


def earlier_run_outputs(
    output_dir: str | os.PathLike[str], extra: Sequence[str] = ()
) -> list[Path]:
    """The `RUN_OUTPUTS` present in `output_dir`, then those of `extra` (paths an app writes
    for the run) that exist: what a fresh run would overwrite."""
    found = [Path(output_dir) / name for name in RUN_OUTPUTS]
    return [p for p in (*found, *map(Path, extra)) if os.path.lexists(p)]


def aside_dir(directory: Path, when: datetime) -> Path:
    """`directory/previous-<YYYYmmddTHHMMSSZ>` (UTC), with `-1`, `-2` ... if that exists."""
    stamp = when.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    candidate, n = directory / f"{PREFIX}{stamp}", 0
    while os.path.lexists(candidate):  # a dangling symlink under the name counts too
        n += 1
        candidate = directory / f"{PREFIX}{stamp}-{n}"
    return candidate


def set_aside_previous_run(paths: Sequence[Path], when: datetime | None = None) -> str | None:
    """Move each of `paths` (files or directories an earlier run wrote) into `previous-<UTC
    time>/` inside its own parent directory (one per parent, one time for all); returns the
    line saying what moved where, None when `paths` is empty."""
    if not paths:
        return None
    when = when or datetime.now(timezone.utc)
    moved: dict[Path, list[str]] = {}
    for path in dict.fromkeys(Path(os.path.abspath(p)) for p in paths):
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
