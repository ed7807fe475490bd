"""Experiment tracking by `track_with`: stdout, jsonl, tensorboard, wandb (optional, offline-friendly).

Metric names are namespaced so every backend shows the same families:
`rollout/*` (generation), `env/*` (episode outcomes), `train/*` (losses, grad norm, lr),
`timing/*` (seconds per phase), `sync/*` (weight transfer), `val/*` (evaluation), `critic/*`,
`warmup/*` (supervised warm-up), `failures/*` (failed episodes by kind), `sandbox/*` (sandbox
pool counts: calls, failures, timeouts, restarts). `Tracker.log` rejects a name outside these families and a
non-finite value is logged as-is (NaN shows up in the curves instead of vanishing).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol, TextIO

from rl_config.atomic_write import write_text_atomically

METRIC_PREFIXES = (
    "rollout/",
    "async/",
    "throughput/",
    "env/",
    "train/",
    "timing/",
    "memory/",
    "sync/",
    "val/",
    "critic/",
    "warmup/",
    "failures/",
    "sandbox/",
    # RLVR (apps/rlvr): rewards per domain, response lengths, DAPO dynamic sampling, data counts
    "reward/",
    "response/",
    "dynamic_sampling/",
    "data/",
    # on-policy distillation (apps/distill): the student's reverse KL to its teachers
    "distill/",
    # recorded learn calls (record_steps): each record's size and the time recording took
    "record/",
)


def check_metric_names(metrics: Mapping[str, Any]) -> None:
    """Raise ValueError for a metric name outside the known families."""
    for name in metrics:
        if not name.startswith(METRIC_PREFIXES) or name.endswith("/"):
            raise ValueError(
                f"metric {name!r} has no known prefix; use one of "
                f"{', '.join(p + '*' for p in METRIC_PREFIXES)}"
            )


class TrackerBackend(Protocol):
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class StdoutBackend:
    """One compact line per step: `step 3 | env/success=0.50 train/loss=0.12 ...`."""

    def __init__(self, stream: TextIO | None = None, keys: Sequence[str] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.keys = list(keys) if keys else None

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        names = self.keys if self.keys is not None else sorted(metrics)
        parts = [f"{k}={_fmt(metrics[k])}" for k in names if k in metrics]
        print(f"step {step} | " + " ".join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        return None


def _fmt(value: float) -> str:
    if isinstance(value, float) and math.isfinite(value) and value != 0 and abs(value) < 1e-3:
        return f"{value:.2e}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class JsonlBackend:
    """Appends `{"step": n, ...metrics}` lines to `<log_dir>/metrics.jsonl` (machine-readable).
    A resumed run goes on in its run's file; before a fresh run, the runner moves an earlier
    run's file aside (rl_runtime.run.previous_run)."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self.path = Path(log_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row, allow_nan=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorboardBackend:
    """`purge_step`: a resumed run's first new step; TensorBoard hides the interrupted run's
    events from it on (they are logged again)."""

    def __init__(self, log_dir: str | os.PathLike[str], purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = str(log_dir)
        self.writer = SummaryWriter(log_dir=self.log_dir, purge_step=purge_step)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, float(value), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbBackend:
    """Weights & Biases; offline unless `mode="online"` and an API key are configured."""

    def __init__(self, log_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ImportError(
                "track_with: wandb needs the wandb package: install rl-runtime[wandb] "
                "(or use track_with: tensorboard)"
            ) from exc
        kwargs = dict(kwargs)
        api_key = kwargs.pop("api_key", None)
        if api_key:
            os.environ.setdefault("WANDB_API_KEY", str(api_key))
        kwargs.setdefault("mode", "online" if os.environ.get("WANDB_API_KEY") else "offline")
        kwargs.setdefault("dir", str(log_dir))
        self.run = wandb.init(**kwargs)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


BACKENDS = ("stdout", "jsonl", "tensorboard", "wandb")
KWARGS_BACKENDS = ("wandb",)
"""Backends that read `tracker_kwargs` beyond `log_dir` (wandb: project, name, mode, ...)."""


def unread_tracker_kwargs(
    track_with: str | Sequence[str] | None, kwargs: Mapping[str, Any]
) -> list[str]:
    """The `tracker_kwargs` keys no backend of `track_with` reads (all but `log_dir` unless a
    `KWARGS_BACKENDS` backend is on)."""
    names = [track_with] if isinstance(track_with, str) else list(track_with or ["stdout"])
    if any(n in KWARGS_BACKENDS for n in names):
        return []
    return [k for k in kwargs if k != "log_dir"]


RUN_LOGS = ("metrics.jsonl", "tensorboard")
"""What the backends write into the log directory that a later run would add to (wandb keeps
each run in a directory of its own)."""


def tracker_log_dir(log_dir: str | os.PathLike[str], tracker_kwargs: Mapping[str, Any]) -> Path:
    """Where a `Tracker` writes: `tracker_kwargs.log_dir`, else `log_dir` (`logging_dir`)."""
    return Path(tracker_kwargs.get("log_dir") or log_dir)


def earlier_run_logs(log_dir: str | os.PathLike[str]) -> list[Path]:
    """The `RUN_LOGS` present in `log_dir` (an earlier run's, before a fresh one starts)."""
    return [Path(log_dir) / name for name in RUN_LOGS if (Path(log_dir) / name).exists()]


class Tracker:
    """Fan-out of metrics to the backends named by `track_with`.

    `track_with`: one name or a list (`stdout`, `jsonl`, `tensorboard`, `wandb`); `jsonl` is always
    added so runs stay machine-readable. `tracker_kwargs.log_dir` overrides `log_dir`.
    `resumed_at`: the checkpoint step a resumed run goes on from (TensorBoard hides the
    interrupted run's later events; metrics.jsonl is cut back by `rewind_metrics`).
    """

    def __init__(
        self,
        track_with: str | Sequence[str] | None,
        log_dir: str | os.PathLike[str],
        tracker_kwargs: Mapping[str, Any] | None = None,
        *,
        stdout_keys: Sequence[str] | None = None,
        stream: TextIO | None = None,
        resumed_at: int | None = None,
    ) -> None:
        names = [track_with] if isinstance(track_with, str) else list(track_with or ["stdout"])
        kwargs = dict(tracker_kwargs or {})
        self.log_dir = tracker_log_dir(log_dir, kwargs)
        kwargs.pop("log_dir", None)
        self.backends: list[TrackerBackend] = []
        unknown = [n for n in names if n not in BACKENDS]
        if unknown:
            raise ValueError(f"track_with: unknown backend(s) {unknown}; choose from {BACKENDS}")
        if "jsonl" not in names:
            names.append("jsonl")
        for name in dict.fromkeys(names):
            if name == "stdout":
                self.backends.append(StdoutBackend(stream, stdout_keys))
            elif name == "jsonl":
                self.backends.append(JsonlBackend(self.log_dir))
            elif name == "tensorboard":
                self.backends.append(
                    TensorboardBackend(
                        self.log_dir / "tensorboard",
                        purge_step=None if resumed_at is None else resumed_at + 1,
                    )
                )
            elif name == "wandb":
                self.backends.append(WandbBackend(self.log_dir, **kwargs))
        self.history: list[dict[str, float]] = []

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        check_metric_names(metrics)
        clean = {k: float(v) for k, v in metrics.items()}
        self.history.append({"step": float(step), **clean})
        for backend in self.backends:
            backend.log(clean, step)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()
        self.backends = []


def rewind_metrics(
    log_dir: str | os.PathLike[str], step: int
) -> tuple[list[dict[str, float]], str | None]:
    """For a run resumed at checkpoint `step`, which goes on in `<log_dir>/metrics.jsonl`: the
    rows the checkpoint covers (`step` <= it: the warm-up's, the evaluation before training, the
    steps trained), for its curves. When the interrupted run logged steps past the checkpoint
    (trained again now, so each would appear twice), or its last line was cut short by the kill
    (the next row would be appended to it), the file is cut back to those rows: written
    atomically, the interrupted file kept whole in `previous-<UTC time>/` beside it
    (rl_runtime.run.previous_run). Returns the rows and the line saying so (None: nothing to cut;
    [] without a file)."""
    from rl_runtime.run.previous_run import aside_dir

    path = Path(log_dir) / "metrics.jsonl"
    if not path.exists():
        return [], None
    rows, torn = _parse_metrics(path)
    kept = [r for r in rows if r.get("step", 0) <= step]
    if len(kept) == len(rows) and not torn:
        return kept, None
    target = aside_dir(path.parent, datetime.now(timezone.utc))
    target.mkdir(parents=True)
    shutil.copy2(path, target / path.name, follow_symlinks=False)  # kept until replaced below
    write_text_atomically(path, "".join(json.dumps(r, allow_nan=True) + "\n" for r in kept))
    dropped = [f"{len(rows) - len(kept)} row(s) the interrupted run logged after step {step} "
               "(trained again and logged anew)"] if len(kept) < len(rows) else []  # fmt: skip
    dropped += ["its last line, cut short by the interruption"] if torn else []
    return (
        kept,
        f"metrics.jsonl: dropped {' and '.join(dropped)}; the interrupted file -> {target}/",
    )


def read_metrics(log_dir: str | os.PathLike[str]) -> list[dict[str, float]]:
    """Rows of `<log_dir>/metrics.jsonl` (what `JsonlBackend` wrote). A last line without its
    newline that is not JSON (a write cut short by a kill) is left out; any other line that is
    not a JSON object with a numeric `step` is a ValueError naming the file and line."""
    return _parse_metrics(Path(log_dir) / "metrics.jsonl")[0]


def _parse_metrics(path: Path) -> tuple[list[dict[str, float]], bool]:
    """(the rows of `path`, whether its last line was cut short) (see `read_metrics`)."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if line.strip():
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as exc:
                if lineno == len(lines) and not text.endswith("\n"):
                    return rows, True
                raise ValueError(f"{path}:{lineno}: not JSON: {exc}") from exc
            step = row.get("step") if isinstance(row, dict) else None
            if not isinstance(step, int | float) or isinstance(step, bool):
                raise ValueError(
                    f"{path}:{lineno}: not a metrics row (a JSON object with a numeric 'step')"
                )
            rows.append(row)
    return rows, False
