"""`StepRecorder`: records learn calls (`Context.train`) as `record_steps` asks, for `rl-replay`
(rl_runtime.state.step_record for the format).

A recorded call keeps the state before it: every rank of the role saves a training checkpoint
(rl_train's layout, signed with the run's checkpoint key) just before the call, in
`records/.pending/<role>/`, which moves into the record. `every:N` does that on every N-th step
only; `nonfinite` on every step (a checkpoint write per step: its cost), kept only when the call
reports a non-finite loss or grad norm, or skipped an optimizer step (the trainer's non-finite
guard). Supervised warm-up calls (`loss="sft"`) are not recorded, nor a role's second call in
one step.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl_runtime.state.step_record import (
    FORMAT,
    StepRecord,
    TrainerSpec,
    hex_metrics,
    record_size,
    write_record,
)

RECORDS_DIR = "records"
PENDING_DIR = ".pending"


def recorder_for(components: Any, config: dict[str, Any]) -> StepRecorder | None:
    """The learn-call recorder the run's `record_steps` asks for (None: none); `config` is the
    run's resolved config record (its hash goes into each record)."""
    kind, every = components.cadence.record_steps
    if kind == "none":
        return None
    from rl_runtime.state.step_record import config_hash

    return StepRecorder(
        kind,
        every,
        Path(components.output_dir) / RECORDS_DIR,
        config_hash=config_hash(config),
        key_file=components.checkpoint.key_file,
    )


def anomalous(metrics: dict[str, Any]) -> bool:
    """Whether a learn call's metrics show a non-finite loss or grad norm, or a skipped
    optimizer step (`<role>/skipped_steps`: the trainer's non-finite guard)."""
    for key, value in metrics.items():
        name = key.rsplit("/", 1)[-1]
        if name == "loss" and not math.isfinite(float(value)):
            return True
        if name == "skipped_steps" and float(value) > 0:
            return True
        if name == "grad_norm" and not math.isfinite(float(value)):
            steps = float(metrics.get(key.replace("grad_norm", "optimizer_steps"), 1.0))
            if steps > 0:  # no optimizer step at all (empty mini-batches) is not an anomaly
                return True
    return False


class StepRecorder:
    """Records `Context.train` calls under `root` (`<output_dir>/records`)."""

    def __init__(
        self,
        kind: str,
        every: int,
        root: str | Path,
        *,
        config_hash: str,
        key_file: str | None,
        writes: bool = True,
    ) -> None:
        if kind not in ("every", "nonfinite"):
            raise ValueError(f"record_steps kind {kind!r}: every or nonfinite")
        self.kind, self.every = kind, every
        self.root = Path(root)
        self.config_hash = config_hash
        self.key_file = key_file
        #: whether this process writes records: False on the other ranks of a role that records
        #: from inside its own processes (each rank runs `train`, `group.call_all` gathers)
        self.writes = writes
        self._done: set[tuple[int, str]] = set()
        self._specs: dict[str, dict[str, Any]] = {}
        #: (step, role, bytes of the record's files, seconds spent recording) of each record
        self.written: list[tuple[int, str, int, float]] = []

    def step_metrics(self, step: int) -> dict[str, float]:
        """`record/bytes` (the records' tensor and metadata files, the checkpoint apart) and
        `record/seconds` (the time recording added) of pipeline step `step`; {} if none."""
        rows = [(size, secs) for s, _role, size, secs in self.written if s == step]
        if not rows:
            return {}
        return {
            "record/bytes": float(sum(r[0] for r in rows)),
            "record/seconds": sum(r[1] for r in rows),
        }

    def wants(self, step: int, role: str, loss: str) -> bool:
        if loss != "default" or (step, role) in self._done:
            return False
        return self.kind == "nonfinite" or step % self.every == 0

    def train(
        self,
        group: Any,
        role: str,
        shards: list[dict[str, Any]],
        loss: str,
        *,
        step: int,
        weight_version: int,
        run: Callable[[], list[dict]],
    ) -> dict:
        """`run()` (the learn call: each rank's metrics), recorded as pipeline step `step` when
        `record_steps` asks; returns rank 0's metrics."""
        if not self.wants(step, role, loss):
            return run()[0]
        self._done.add((step, role))
        t0 = time.perf_counter()
        pending = self.root / PENDING_DIR / role
        if self.writes:
            shutil.rmtree(pending, ignore_errors=True)
        checkpoint = pending / "checkpoint"
        group.call_all("save_checkpoint", str(checkpoint), step - 1, key_file=self.key_file)
        rngs = group.call_all("rng_state")
        if role not in self._specs:
            self._specs[role] = group.call_all("replay_spec")[0]
        spent = time.perf_counter() - t0
        metrics = run()
        t1 = time.perf_counter()
        if self.kind == "nonfinite" and not anomalous(metrics[0]):
            if self.writes:
                shutil.rmtree(pending, ignore_errors=True)
            return metrics[0]
        checksum = group.call_all("weight_checksum")[0]
        if not self.writes:
            return metrics[0]
        record = StepRecord(
            format=FORMAT,
            step=step,
            role=role,
            loss=loss,
            trigger=self.kind if self.kind == "nonfinite" else f"every:{self.every}",
            weight_version=weight_version,
            config_hash=self.config_hash,
            checkpoint_step=step - 1,
            trainer=TrainerSpec(**self._specs[role]),
            metrics=hex_metrics(metrics[0]),
            weight_checksum=checksum,
            files={},
        )
        tensors = [
            {**{f"batch.{k}": v for k, v in shard.items()}, "rng.torch": rng}
            for shard, rng in zip(shards, rngs, strict=True)
        ]
        out = write_record(
            self.root / f"step-{step}" / role, record, tensors, checkpoint, key_file=self.key_file
        )
        shutil.rmtree(pending, ignore_errors=True)
        spent += time.perf_counter() - t1
        self.written.append((step, role, record_size(out), spent))
        return metrics[0]
