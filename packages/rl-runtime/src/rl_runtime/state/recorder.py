"""`StepRecorder`: records learn calls (`Context.train`) as `record_steps` asks, for `rl-replay`
(rl_runtime.state.step_record for the format).

A recorded call keeps the state before it: every rank of the role saves a training checkpoint
(rl_train's layout, signed with the run's checkpoint key) just before the call, in
`records/.pending/<role>/`, which moves into the record. `every:N` does that on every N-th step
only. The anomaly triggers (`AnomalyWatch`) decide per call: `nonfinite` (a non-finite loss or
grad norm, or a skipped optimizer step: the trainer's non-finite guard) and `spike:K` (a loss
or grad norm more than K standard deviations from the mean of the role's previous
`RECORD_WINDOW` finite values) are known only after the call, so the state is saved before every
call (a checkpoint write per step: their cost) and kept only for a recorded one;
`reward_collapse:K` (the batch's mean reward more than K standard deviations below the previous
steps' mean) is known before the call, which alone saves the state only for a collapsed step.
Supervised warm-up calls (`loss="sft"`) are not recorded, nor a role's second call in one step.
"""

from __future__ import annotations

import math
import queue
import shutil
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from rl_config.schema.pipeline import RECORD_MIN_HISTORY, RECORD_WINDOW
from rl_runtime.state.step_record import (
    FORMAT,
    StepRecord,
    TrainerSpec,
    hex_metrics,
    manifest_sha256,
    record_size,
    write_record,
)

RECORDS_DIR = "records"
PENDING_DIR = ".pending"
#: `every:1`: a record saves the state before its step every this many steps (its chain's
#: base); the ones between replay from that base (StepRecorder)
CHAIN_CHECKPOINT_EVERY = 50


def recorder_for(components: Any, config: dict[str, Any]) -> StepRecorder | None:
    """The learn-call recorder the run's `record_steps` asks for (None: none); `config` is the
    run's resolved config record (its hash goes into each record)."""
    kind, every, triggers = components.cadence.record_steps
    if kind == "none":
        return None
    from rl_runtime.state.step_record import config_hash

    return StepRecorder(
        kind,
        every,
        Path(components.output_dir) / RECORDS_DIR,
        config_hash=config_hash(config),
        key_file=components.checkpoint.key_file,
        triggers=triggers,
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


def _outlier(value: float, window: Sequence[float], k: float) -> tuple[float, float] | None:
    """(mean, standard deviation) of `window` when `value` lies more than `k` of them from the
    mean (a window of one value: any other value), else None; None too under
    `RECORD_MIN_HISTORY` values."""
    if len(window) < RECORD_MIN_HISTORY:
        return None
    mean, sd = statistics.fmean(window), statistics.pstdev(window)
    return (mean, sd) if abs(value - mean) > k * sd and value != mean else None


def mean_reward(shards: Sequence[dict[str, Any]]) -> float | None:
    """The mean reward of a learn call's rows: `episode_rewards` `[B]`, else the token
    `rewards` `[B, T]` summed per row; None for a batch without rewards (preference pairs)."""
    rows = []
    for shard in shards:
        if "episode_rewards" in shard:
            rows.append(shard["episode_rewards"].double().reshape(-1))
        elif "rewards" in shard and shard["rewards"].dim() == 2:
            rows.append(shard["rewards"].double().sum(-1))
    if not rows:
        return None
    import torch

    values = torch.cat(rows)
    return float(values.mean()) if values.numel() else None


class AnomalyWatch:
    """The `record_steps` anomaly triggers of a run: per role, a window of the previous
    `RECORD_WINDOW` finite losses, grad norms and mean rewards."""

    def __init__(self, triggers: Sequence[tuple[str, float]]) -> None:
        self.triggers = dict(triggers)
        self._windows: dict[tuple[str, str], deque[float]] = {}

    @property
    def after_the_call(self) -> bool:
        """Whether a trigger needs the call's metrics (then the state is saved before each)."""
        return "nonfinite" in self.triggers or "spike" in self.triggers

    def _window(self, role: str, name: str) -> deque[float]:
        return self._windows.setdefault((role, name), deque(maxlen=RECORD_WINDOW))

    def before(self, role: str, shards: Sequence[dict[str, Any]]) -> str | None:
        """The reward-collapse reason of a call about to train on `shards`, or None (the mean
        reward joins the window either way)."""
        if "reward_collapse" not in self.triggers:
            return None
        reward = mean_reward(shards)
        if reward is None or not math.isfinite(reward):
            return None
        window = self._window(role, "reward")
        k = self.triggers["reward_collapse"]
        found = _outlier(reward, window, k)
        window.append(reward)
        if found is None or reward > found[0]:
            return None
        return (
            f"reward_collapse:{k:g} (mean reward {reward:.6g}, previous {RECORD_WINDOW} steps' "
            f"mean {found[0]:.6g} sd {found[1]:.3g})"
        )

    def after(self, role: str, metrics: dict[str, Any]) -> str | None:
        """The nonfinite or spike reason of a call that returned `metrics`, or None (its finite
        loss and grad norm join the windows either way)."""
        if "nonfinite" in self.triggers and anomalous(metrics):
            return "nonfinite"
        reason = None
        k = self.triggers.get("spike")
        for key in sorted(metrics):
            name = key.rsplit("/", 1)[-1]
            if name not in ("loss", "grad_norm") or not isinstance(metrics[key], int | float):
                continue
            value = float(metrics[key])
            if not math.isfinite(value):
                continue
            window = self._window(role, key)
            found = None if k is None else _outlier(value, window, k)
            window.append(value)
            if found is not None and reason is None:
                reason = (
                    f"spike:{k:g} ({key} {value:.6g}, previous {RECORD_WINDOW} values' mean "
                    f"{found[0]:.6g} sd {found[1]:.3g})"
                )
        return reason


class RecordWriter:
    """Writes records off the learn call's critical path: one background thread, in submission
    order (a chained record reads the manifest of the one before it). A write's error is raised
    by the next `submit` or by `flush`."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="step-record-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                if self._error is None:
                    job()
            except BaseException as err:  # raised in the training thread by submit/flush
                self._error = err
            finally:
                self._queue.task_done()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"writing a step record failed: {err!r}") from err

    def submit(self, job: Callable[[], None]) -> None:
        self._raise()
        self._queue.put(job)

    def flush(self) -> None:
        """Wait until every submitted record is written (renamed into place) or failed."""
        self._queue.join()
        self._raise()

    def close(self) -> None:
        self._queue.join()
        self._queue.put(None)
        self._thread.join(timeout=60)
        self._raise()


class StepRecorder:
    """Records `Context.train` calls under `root` (`<output_dir>/records`).

    `every:1` chains: a record saves the state before its step only every
    `CHAIN_CHECKPOINT_EVERY` steps (or after a gap); the records between name that one as their
    base and bind each record since it by its manifest's sha256, and `rl-replay` replays those
    steps first (each checked bit-exact). The checkpoint, saved with the trainer's collectives,
    stays on the call's path; the record files are written and signed by a background thread
    (`RecordWriter`): `step_metrics` reports a record once it is complete, `close` waits for all.
    """

    def __init__(
        self,
        kind: str,
        every: int,
        root: str | Path,
        *,
        config_hash: str,
        key_file: str | None,
        triggers: Sequence[tuple[str, float]] = (),
        writes: bool = True,
        chain_every: int = CHAIN_CHECKPOINT_EVERY,
    ) -> None:
        if kind not in ("every", "anomaly") or (kind == "anomaly") != bool(triggers):
            raise ValueError(
                f"record_steps kind {kind!r} with triggers {list(triggers)}: every (no "
                "triggers) or anomaly (one or more)"
            )
        self.kind, self.every = kind, every
        self.watch = AnomalyWatch(triggers)
        self.root = Path(root)
        self.config_hash = config_hash
        self.key_file = key_file
        #: whether this process writes records: False on the other ranks of a role that records
        #: from inside its own processes (each rank runs `train`, `group.call_all` gathers)
        self.writes = writes
        self.chain_every = chain_every
        self._done: set[tuple[int, str]] = set()
        self._specs: dict[str, dict[str, Any]] = {}
        #: per role: (the base step of its chain, the last step it recorded)
        self._chains: dict[str, tuple[int, int]] = {}
        self._writer = RecordWriter() if writes else None
        self._lock = threading.Lock()
        #: (step, role, bytes of the record's files, seconds on the call's path) of each record
        #: written (complete, renamed into place)
        self.written: list[tuple[int, str, int, float]] = []
        self._reported = 0

    def step_metrics(self, step: int, *, wait: bool = False) -> dict[str, float]:
        """`record/bytes` (the tensor, metadata and manifest files, the checkpoint apart) and
        `record/seconds` (the time recording added to the learn calls) of the records completed
        since the last call (`wait`: after waiting for all), reported at pipeline step `step`;
        {} if none."""
        if wait:
            self.flush()
        with self._lock:
            rows = self.written[self._reported :]
            self._reported = len(self.written)
        if not rows:
            return {}
        return {
            "record/bytes": float(sum(r[2] for r in rows)),
            "record/seconds": sum(r[3] for r in rows),
        }

    def flush(self) -> None:
        """Wait until every record is written (and raise a failed write's error)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()

    def wants(self, step: int, role: str, loss: str) -> bool:
        if loss != "default" or (step, role) in self._done:
            return False
        return self.kind == "anomaly" or step % self.every == 0

    def _base(self, step: int, role: str) -> int:
        """The step whose record holds the state this one starts from (itself: save it)."""
        chain = self._chains.get(role)
        if (
            self.kind != "every"
            or chain is None
            or chain[1] != step - 1
            or step - chain[0] >= self.chain_every
        ):
            return step
        return chain[0]

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
        reason = self.watch.before(role, shards) if self.kind == "anomaly" else None
        if self.kind == "anomaly" and reason is None and not self.watch.after_the_call:
            metrics = run()  # reward_collapse alone: decided before the call, no state saved
            return metrics[0]
        base = self._base(step, role)
        pending = self.root / PENDING_DIR / role / str(step)
        checkpoint: Path | None = None
        if base == step:
            if self.writes:
                shutil.rmtree(pending, ignore_errors=True)
            checkpoint = pending / "checkpoint"
            group.call_all("save_checkpoint", str(checkpoint), step - 1, key_file=self.key_file)
        rngs = group.call_all("rng_state")
        if role not in self._specs:
            self._specs[role] = group.call_all("replay_spec")[0]
        # the batch as the call gets it (the caller may reuse its tensors afterwards)
        tensors = [
            {**{f"batch.{k}": v.detach().cpu().clone() for k, v in shard.items()}, "rng.torch": rng}
            for shard, rng in zip(shards, rngs, strict=True)
        ]
        spent = time.perf_counter() - t0
        metrics = run()
        t1 = time.perf_counter()
        if self.kind == "anomaly":
            after = self.watch.after(role, metrics[0])
            reason = reason or after
            if reason is None:
                if self.writes:
                    shutil.rmtree(pending, ignore_errors=True)
                return metrics[0]
        checksum = group.call_all("weight_checksum")[0]
        self._chains[role] = (base, step)
        if self._writer is None:
            return metrics[0]
        record = StepRecord(
            format=FORMAT,
            step=step,
            role=role,
            loss=loss,
            trigger=reason or f"every:{self.every}",
            weight_version=weight_version,
            config_hash=self.config_hash,
            checkpoint_step=base - 1,
            trainer=TrainerSpec(**self._specs[role]),
            metrics=hex_metrics(metrics[0]),
            weight_checksum=checksum,
            files={},
            base_step=base,
            previous={},
        )
        spent += time.perf_counter() - t1

        def write() -> None:
            previous = {
                str(s): manifest_sha256(self.root / f"step-{s}" / role) for s in range(base, step)
            }
            out = write_record(
                self.root / f"step-{step}" / role,
                msgspec.structs.replace(record, previous=previous),
                tensors,
                checkpoint,
                key_file=self.key_file,
            )
            shutil.rmtree(pending, ignore_errors=True)
            with self._lock:
                self.written.append((step, role, record_size(out), spent))

        self._writer.submit(write)
        return metrics[0]
