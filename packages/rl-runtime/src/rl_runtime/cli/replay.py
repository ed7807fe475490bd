"""`rl-replay STEP_DIR [--role ROLE] [--set KEY=VALUE] [--detect-anomaly] [--key-file FILE]`:
replay a recorded learn call (`record_steps`; rl_runtime.state.step_record) offline.

The trainer is built again as the run built it (strategy, model, training/model/loss arguments),
loaded from the record's checkpoint of the state before the step, given the recorded torch RNG
state and thread count, and trained on the recorded batch. The loss, per-term losses, grad norm,
KL, clip fraction (whatever metrics the trainer returns) and the weight checksum after the step
are compared with the recorded ones: on the same machine, torch build and backend they are
identical (bit-exact; the throughput metric `*/response_tokens_per_s` is wall-clock and not
compared). `--set KEY=VALUE` replays with one argument changed (a field of the loss config, e.g.
`clip_ratio_high` or `kl_loss_coef`, or of the training arguments, e.g. `learning_rate`;
`loss.X` / `training.X` to say which) and prints each difference. `--detect-anomaly` replays
under `torch.autograd.detect_anomaly` with a forward hook on every module, and reports the
recorded batch tensors holding NaN/inf, the first module whose output is non-finite (and its
non-finite parameters) and the first backward function that returned a non-finite gradient.

STEP_DIR is `<output_dir>/records/step-<N>` (with several roles recorded, `--role` picks one;
default actor_train) or `.../step-<N>/<role>`. A record is untrusted input: its files are
checked against its signed manifest (rl_train.signing, the run's checkpoint key: `--key-file`,
default as the run's), which covers its metadata, its batch files and its checkpoint; a record
changed in any of them is refused naming the file. A record of several ranks replays in as many gloo
processes (`--detect-anomaly`: one rank only).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rl_runtime.cli.anomaly import nonfinite_inputs, watch_nonfinite
from rl_runtime.state.step_record import (
    CHECKPOINT_DIR,
    RECORD_NAME,
    RecordError,
    StepRecord,
    read_chain,
    read_record,
    record_size,
    split_rank_tensors,
)

#: metrics that measure wall-clock time, not the step's numbers (not compared)
UNCOMPARED_SUFFIXES = ("/response_tokens_per_s",)


@dataclass
class ReplayResult:
    record: StepRecord
    directory: Path
    metrics: dict[str, float]
    weight_checksum: str
    change: tuple[str, Any] | None = None
    #: --detect-anomaly: where the first non-finite value arose (forward module, backward op)
    anomaly: dict[str, str] = field(default_factory=dict)

    def compared(self) -> list[tuple[str, float, float | None]]:
        """(metric, recorded, replayed) of each compared metric the record has."""
        recorded = self.record.metric_values()
        return [
            (k, recorded[k], self.metrics.get(k))
            for k in sorted(recorded)
            if not k.endswith(UNCOMPARED_SUFFIXES)
        ]

    def differences(self) -> list[str]:
        """Each compared quantity whose replayed bits differ from the recorded ones."""
        out = [k for k, a, b in self.compared() if b is None or a.hex() != b.hex()]
        if self.weight_checksum != self.record.weight_checksum:
            out.append("weight_checksum")
        return out

    @property
    def bit_exact(self) -> bool:
        return not self.differences()


def find_record(step_dir: str | Path, role: str | None = None) -> Path:
    """The record directory of `step_dir` (a step's directory or one role's)."""
    path = Path(step_dir)
    if (path / RECORD_NAME).is_file():
        return path
    roles = (
        sorted(p.name for p in path.iterdir() if (p / RECORD_NAME).is_file())
        if path.is_dir()
        else []
    )
    if not roles:
        raise RecordError(
            f"{path}: no step record here (expected {RECORD_NAME} or <role>/{RECORD_NAME})"
        )
    chosen = role or ("actor_train" if "actor_train" in roles else roles[0])
    if chosen not in roles:
        raise RecordError(f"{path}: no record of role {chosen!r}; recorded: {roles}")
    return path / chosen


def _loss_config_class(name: str | None) -> Any:
    if name is None:
        return None
    from rl_train.losses import ActorLossConfig, CriticLossConfig
    from rl_train.preference import PreferenceLossConfig

    classes = {c.__name__: c for c in (ActorLossConfig, CriticLossConfig, PreferenceLossConfig)}
    if name not in classes:
        raise RecordError(f"loss_config_type {name!r}: not one of {sorted(classes)}")
    return classes[name]


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def apply_change(spec: dict[str, Any], assignment: str) -> tuple[str, Any]:
    """Set `KEY=VALUE` in the trainer spec's loss config or training arguments (in place);
    returns (the field's qualified name, the value). Unknown or ambiguous keys are refused."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set {assignment!r}: expected KEY=VALUE")
    key = key.strip()
    sections = {"loss": "loss_config", "training": "training_args"}
    prefix, _, name = key.partition(".")
    if prefix in sections and name:
        places = [sections[prefix]]
    else:
        name = key
        places = [s for s in sections.values() if name in (spec.get(s) or {})]
    found = [p for p in places if name in (spec.get(p) or {})]
    if not found:
        known = {s: sorted(spec.get(s) or {}) for s in sections.values()}
        raise ValueError(f"--set {key}: no such field; loss.* and training.* fields: {known}")
    if len(found) > 1:
        raise ValueError(f"--set {key}: in both {found}; say loss.{name} or training.{name}")
    value = _parse_value(raw)
    spec[found[0]] = {**spec[found[0]], name: value}
    return f"{'loss' if found[0] == 'loss_config' else 'training'}.{name}", value


def build_trainer(spec: dict[str, Any], rank: int = 0, world_size: int = 1) -> Any:
    """A TrainWorker (rank `rank` of `world_size`: RANK/WORLD_SIZE in the environment) built as
    the record's trainer spec says."""
    import msgspec

    from rl_runtime.cluster.train_worker import TrainWorker
    from rl_train.args import ModelArgs, TrainingArgs

    model = Path(spec["model_path"])
    if not model.is_dir():
        raise RecordError(f"the recorded model directory {model} does not exist on this machine")
    loss_cls = _loss_config_class(spec["loss_config_type"])
    try:
        training = msgspec.convert(spec["training_args"], TrainingArgs)
        model_args = msgspec.convert(spec["model_args"], ModelArgs)
        loss = None if loss_cls is None else msgspec.convert(spec["loss_config"], loss_cls)
    except (msgspec.ValidationError, ValueError, TypeError) as err:
        raise RecordError(f"the recorded trainer arguments do not build: {err}") from None
    return TrainWorker(
        rank=rank,
        world_size=world_size,
        dist_env={},
        role=spec["backend_role"],
        model_path=str(model),
        strategy_name=spec["strategy_name"],
        strategy_config=spec["strategy_config"],
        training_args=training,
        model_args=model_args,
        loss_config=loss,
    )


def _ready_worker(
    directory: Path,
    record: StepRecord,
    spec: dict[str, Any],
    key_file: str | None,
    scratch: Path,
    rank: int = 0,
) -> Any:
    """A trainer built from `spec` in the state before `record`'s step: loaded from the
    record's checkpoint, or from its chain's base, then trained on each record since (each
    checked bit-exact against its recorded weights). With a changed `spec` the chain is replayed
    as recorded and the state handed over through a checkpoint in `scratch`."""
    import msgspec

    world = record.trainer.world_size
    chain = read_chain(directory, record, key_file)
    base = chain[0][0] if chain else directory
    recorded = msgspec.to_builtins(record.trainer)
    worker = build_trainer(recorded if chain else spec, rank=rank, world_size=world)
    try:
        worker.load_checkpoint(str(base / CHECKPOINT_DIR), key_file=key_file)
        for other, earlier, tensors in chain:
            batch, rng = split_rank_tensors(tensors[rank])
            torch.set_num_threads(earlier.trainer.num_threads)
            if rng is not None:
                torch.set_rng_state(rng)
            worker.train_step(batch, earlier.loss)
            if worker.weight_checksum() != earlier.weight_checksum:
                raise RecordError(
                    f"{other}: replaying the chain to step {record.step}, the weights after "
                    f"step {earlier.step} differ from its record (not bit-exact here)"
                )
        if not chain or spec == recorded:
            return worker
        worker.save_checkpoint(str(scratch), record.step - 1, key_file=key_file)
    finally:
        if chain and spec != recorded:
            worker.shutdown()
    changed = build_trainer(spec, rank=rank, world_size=world)
    changed.load_checkpoint(str(scratch), key_file=key_file)
    return changed


def replay(
    step_dir: str | Path,
    *,
    role: str | None = None,
    change: str | None = None,
    detect_anomaly: bool = False,
    key_file: str | None = None,
) -> ReplayResult:
    """Replay one recorded learn call (see the module docstring)."""
    import tempfile

    import msgspec

    directory = find_record(step_dir, role)
    record, tensors = read_record(directory, key_file)
    spec = msgspec.to_builtins(record.trainer)
    applied = apply_change(spec, change) if change else None
    anomaly: dict[str, str] = {}
    world = record.trainer.world_size
    if world > 1:
        if detect_anomaly:
            raise RecordError(f"{directory}: --detect-anomaly replays one rank; this has {world}")
        metrics, checksum = _replay_ranks(directory, spec, key_file, world)
        return ReplayResult(record, directory, metrics, checksum, applied, anomaly)
    batch, rng = split_rank_tensors(tensors[0])
    with tempfile.TemporaryDirectory(prefix="rl-replay-") as scratch:
        worker = _ready_worker(directory, record, spec, key_file, Path(scratch) / "state")
        try:
            torch.set_num_threads(record.trainer.num_threads)
            if rng is not None:
                torch.set_rng_state(rng)
            if detect_anomaly:
                anomaly.update(nonfinite_inputs(batch))
                metrics = _replay_watched(worker, batch, record.loss, anomaly)
            else:
                metrics = worker.train_step(batch, record.loss)
            checksum = worker.weight_checksum()
        finally:
            worker.shutdown()
    return ReplayResult(record, directory, dict(metrics), checksum, applied, anomaly)


def _replay_ranks(
    directory: Path, spec: dict[str, Any], key_file: str | None, world: int
) -> tuple[dict[str, float], str]:
    """The replay of a record of `world` ranks: as many gloo processes (rl_train.dist.spawn),
    each on its own rows and RNG state; rank 0's metrics and the weight checksum."""
    import tempfile

    from rl_train.dist import spawn

    with tempfile.TemporaryDirectory(prefix="rl-replay-") as tmp:
        out = Path(tmp) / "rank0.json"
        env = {"OMP_NUM_THREADS": str(spec["num_threads"])}
        spawn(_replay_rank, world, str(directory), spec, key_file, str(out), env=env)
        result = json.loads(out.read_text())
    return {k: float.fromhex(v) for k, v in result["metrics"].items()}, result["checksum"]


def _replay_rank(
    rank: int, directory: str, spec: dict[str, Any], key_file: str | None, out: str
) -> None:
    """One rank of `_replay_ranks` (module level: spawned)."""
    from rl_runtime.state.step_record import hex_metrics

    record, tensors = read_record(Path(directory), key_file)
    batch, rng = split_rank_tensors(tensors[rank])
    scratch = Path(out).parent / "state"
    worker = _ready_worker(Path(directory), record, spec, key_file, scratch, rank=rank)
    try:
        torch.set_num_threads(record.trainer.num_threads)
        if rng is not None:
            torch.set_rng_state(rng)
        metrics = worker.train_step(batch, record.loss)
        checksum = worker.weight_checksum()
        if rank == 0:
            Path(out).write_text(
                json.dumps({"metrics": hex_metrics(metrics), "checksum": checksum})
            )
    finally:
        worker.shutdown()


def _replay_watched(worker: Any, batch: dict, loss: str, found: dict[str, str]) -> dict:
    model = worker.backend._module()
    with watch_nonfinite(model, found), torch.autograd.detect_anomaly(check_nan=True):
        try:
            return worker.train_step(batch, loss)
        except RuntimeError as err:
            if "returned nan" not in str(err) and "nan values" not in str(err):
                raise
            found["backward"] = str(err).splitlines()[0]
            return {}


def _fmt(value: float | None) -> str:
    return "missing" if value is None else f"{value:.9g}"


def report(result: ReplayResult) -> str:
    r = result.record
    lines = [
        f"replay of step {r.step} ({r.role}, trigger {r.trigger}, weight version "
        f"{r.weight_version}) from {result.directory}",
        f"  record: {record_size(result.directory)} bytes (tensors and metadata), state of "
        f"step {r.checkpoint_step}, config {r.config_hash[:12]}",
    ]
    if result.change is not None:
        lines.append(f"  with {result.change[0]} = {result.change[1]!r}")
    compared = result.compared()
    if result.anomaly and not result.metrics:
        lines.append("  (the replay stopped at the first non-finite gradient: no metrics)")
        compared = []
    for key, recorded, replayed in compared:
        same = replayed is not None and recorded.hex() == replayed.hex()
        delta = (
            ""
            if same or replayed is None or not math.isfinite(replayed - recorded)
            else (f"  delta {replayed - recorded:+.6g}")
        )
        mark = "identical" if same else "DIFFERS"
        lines.append(
            f"  {key:40s} recorded {_fmt(recorded):>14s}  replayed {_fmt(replayed):>14s}  {mark}{delta}"
        )
    same = result.weight_checksum == r.weight_checksum
    lines.append(
        f"  {'weight checksum':40s} recorded {r.weight_checksum[:14]}  replayed "
        f"{result.weight_checksum[:14]}  {'identical' if same else 'DIFFERS'}"
    )
    if result.anomaly and "module" not in result.anomaly:
        lines.append("  anomaly: no module's forward output is non-finite")
    for key in ("batch", "module", "module_type", "inputs", "nonfinite_parameters", "backward"):
        if key in result.anomaly:
            lines.append(f"  anomaly {key}: {result.anomaly[key]}")
    if result.anomaly == {} and result.change is None:
        lines.append(
            f"  bit-exact: {'yes' if result.bit_exact else 'NO: ' + ', '.join(result.differences())}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rl-replay", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("step_dir", help="<output_dir>/records/step-<N> (or .../step-<N>/<role>)")
    parser.add_argument("--role", default=None, help="the recorded role (default actor_train)")
    parser.add_argument("--set", dest="change", default=None, metavar="KEY=VALUE",
                        help="replay with one loss/training argument changed")  # fmt: skip
    parser.add_argument("--detect-anomaly", action="store_true",
                        help="report where the first non-finite value arose")  # fmt: skip
    parser.add_argument("--key-file", default=None, help="the run's checkpoint key file")
    args = parser.parse_args(argv)
    from rl_train.signing import CheckpointError

    try:
        result = replay(
            args.step_dir,
            role=args.role,
            change=args.change,
            detect_anomaly=args.detect_anomaly,
            key_file=args.key_file,
        )
    except (RecordError, CheckpointError, ValueError) as err:
        print(f"rl-replay: {err}", file=sys.stderr)
        return 2
    print(report(result))
    if args.change is None and not args.detect_anomaly and not result.bit_exact:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
