"""Per-phase wall-clock timing and the rich progress display."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


class PhaseTimer:
    """Accumulates seconds per phase within one step: `with timer.phase("rollout"): ...`.

    With ``device_kind`` an accelerator (cuda, npu), it also records this process's device memory
    per phase: ``memory/<phase>_peak_gib`` (the allocator's peak during the phase) and
    ``memory/<phase>_end_gib`` (allocated when it ends), so colocated hand-offs (offload/onload,
    sleep/wake) show up in the metrics. On cpu only seconds are kept.
    """

    def __init__(self, device_kind: str | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.memory: dict[str, float] = {}
        self.device_kind = device_kind if device_kind not in (None, "cpu") else None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.device_kind is not None:
            from rl_sync.device import reset_peak_memory_stats, synchronize

            synchronize(self.device_kind)  # type: ignore[arg-type]
            reset_peak_memory_stats(self.device_kind)  # type: ignore[arg-type]
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.device_kind is not None:
                from rl_sync.device import memory_stats, synchronize

                synchronize(self.device_kind)  # type: ignore[arg-type]
                mem = memory_stats(self.device_kind)  # type: ignore[arg-type]
                peak = f"memory/{name}_peak_gib"
                self.memory[peak] = max(self.memory.get(peak, 0.0), mem["peak_gib"])
                self.memory[f"memory/{name}_end_gib"] = mem["allocated_gib"]
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        """`timing/<phase>` seconds plus `timing/step` (their sum); `memory/*` on accelerators."""
        out = {f"timing/{k}": v for k, v in self.seconds.items()}
        out["timing/step"] = sum(self.seconds.values())
        out.update(self.memory)
        return out

    def reset(self) -> None:
        self.seconds = {}
        self.memory = {}


class StepProgress:
    """A rich progress bar over training steps with the last step's phase timings; when stderr is
    not a terminal (a log file, CI), one plain line per step on `stream` (stdout) instead:
    ``step 3/50 | success_rate=0.42 | rollout=4.1s actor_train=1.2s ... | 38s``."""

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
    ) -> None:
        self.console = Console(stderr=True)
        self.enabled = enabled and self.console.is_terminal
        self.total = total_steps
        self.done = start_step
        self.stream = stream
        self.started = time.perf_counter()
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[phases]}"),
            console=self.console,
            disable=not self.enabled,
        )
        self.task = self.progress.add_task(
            "train", total=total_steps, completed=start_step, phases=""
        )

    def __enter__(self) -> StepProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def advance(self, timings: Mapping[str, float], extra: str = "") -> None:
        phases = " ".join(
            f"{k.removeprefix('timing/')}={v:.1f}s"
            for k, v in timings.items()
            if k != "timing/step"
        )
        self.progress.update(self.task, advance=1, phases=f"{phases} {extra}".strip())
        self.done += 1
        if not self.enabled:
            elapsed = time.perf_counter() - self.started
            print(
                f"step {self.done}/{self.total} | {extra} | {phases} | {elapsed:.0f}s",
                file=self.stream or sys.stdout,
                flush=True,
            )


@contextmanager
def long_phase(
    name: str, *, after_s: float = 5.0, every_s: float = 10.0, stream: TextIO | None = None
) -> Iterator[None]:
    """Progress of a phase that shows nothing else while it runs (an evaluation, a warm-up):
    once it has lasted `after_s` seconds, a plain line every `every_s` seconds on `stream`
    (stdout; on a terminal and in a log alike), ``evaluation: running, 15s so far``, and
    ``evaluation: done in 42s`` at its end; nothing for a phase shorter than `after_s`."""
    out = stream or sys.stdout
    done = threading.Event()
    started = time.perf_counter()
    shown: list[bool] = []

    def tick() -> None:
        wait = after_s
        while not done.wait(wait):
            print(f"{name}: running, {time.perf_counter() - started:.0f}s so far", file=out,
                  flush=True)  # fmt: skip
            shown.append(True)
            wait = every_s

    thread = threading.Thread(target=tick, name=f"progress: {name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if shown:
            print(f"{name}: done in {time.perf_counter() - started:.0f}s", file=out, flush=True)


def summary_table(title: str, rows: Mapping[str, Mapping[str, float | str]]) -> Table:
    """A rich table: one row per key, a column per key of any row (in first-seen order); a row
    without a column's key leaves that cell empty."""
    table = Table(title=title)
    columns: list[str] = []
    for values in rows.values():
        columns += [c for c in values if c not in columns]
    table.add_column("")
    for c in columns:
        table.add_column(c, justify="right")
    for name, values in rows.items():
        cells = []
        for c in columns:
            v = values.get(c, "")
            cells.append(f"{v:.3f}" if isinstance(v, float) else str(v))
        table.add_row(name, *cells)
    return table
