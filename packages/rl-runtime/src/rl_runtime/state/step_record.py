"""A recorded learn call (`rl-replay`'s input): what one `train_step` of a role consumed and
reported, under `output_dir/records/step-<N>/<role>/`:

- `record.json`: a `StepRecord` (msgspec JSON): the step, role, weight version, config hash,
  how the trainer was built (strategy, model path, training/model/loss arguments), the rank-0
  metrics the trainer returned (as `float.hex` strings: NaN and inf survive), the weight checksum
  after the step, and each tensor file's sha256, size, tensor names, dtypes and shapes;
- `rank<r>.safetensors`: rank r's rows of the collated batch (`batch.<key>`, each `[B_r, ...]`)
  and its torch RNG state before the step (`rng.torch`, uint8);
- `checkpoint/`: the role's training checkpoint of the state before the step (rl_train's layout,
  signed manifest), what the replay rebuilds the trainer from.

Nothing is pickled. A record directory is untrusted input: `read_record` bounds every size,
checks each file's sha256 and each tensor's name, dtype and shape against `record.json`, and
refuses a mismatch naming the file.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import torch

RECORD_NAME = "record.json"
CHECKPOINT_DIR = "checkpoint"
FORMAT = 1
#: bounds of what `read_record` reads (a record of a tiny-to-mid model's batch is far smaller)
MAX_META_BYTES = 16 << 20
MAX_FILE_BYTES = 8 << 30
MAX_TENSORS = 256
#: dtypes a record may hold (batch tensors and the uint8 RNG state)
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in DTYPES.items()}


class RecordError(ValueError):
    """A record directory that is missing, malformed or does not match its metadata."""


class TensorEntry(msgspec.Struct, frozen=True):
    dtype: str
    shape: list[int]


class FileEntry(msgspec.Struct, frozen=True):
    sha256: str
    bytes: int
    tensors: dict[str, TensorEntry]


class TrainerSpec(msgspec.Struct, frozen=True):
    """How the recorded role's trainer was built (rl_runtime.cluster.train_worker.TrainWorker's
    arguments): enough to build it again."""

    strategy_name: str
    model_path: str
    backend_role: str
    world_size: int
    strategy_config: dict[str, Any]
    training_args: dict[str, Any]
    model_args: dict[str, Any]
    loss_config_type: str | None
    loss_config: dict[str, Any] | None
    num_threads: int
    torch_version: str


class StepRecord(msgspec.Struct, frozen=True):
    format: int
    step: int
    role: str
    loss: str
    trigger: str
    weight_version: int
    config_hash: str
    checkpoint_step: int
    trainer: TrainerSpec
    #: rank 0's metrics of the learn call, as `float.hex` strings
    metrics: dict[str, str]
    weight_checksum: str
    files: dict[str, FileEntry]

    def metric_values(self) -> dict[str, float]:
        return {k: float.fromhex(v) for k, v in self.metrics.items()}


def hex_metrics(metrics: Mapping[str, Any]) -> dict[str, str]:
    """Float metrics as `float.hex` strings (bit-exact, NaN/inf kept); others dropped."""
    return {k: float(v).hex() for k, v in metrics.items() if isinstance(v, int | float)}


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 of the resolved config's canonical JSON."""
    return hashlib.sha256(msgspec.json.encode(config, order="sorted")).hexdigest()


def weight_checksum(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over the named full tensors, by name: each name, dtype, shape and raw bytes."""
    h = hashlib.sha256()
    for name, tensor in sorted(named, key=lambda item: item[0]):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def rng_tensor() -> torch.Tensor:
    """This process's torch CPU RNG state, `[N]` uint8."""
    return torch.get_rng_state()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def rank_file(rank: int) -> str:
    return f"rank{rank}.safetensors"


def write_record(
    directory: Path,
    record: StepRecord,
    rank_tensors: list[dict[str, torch.Tensor]],
    checkpoint: Path | None,
) -> Path:
    """Write `record` (its `files` filled here) and each rank's tensors into `directory`
    atomically: a temporary sibling renamed into place. `checkpoint` (a role checkpoint root,
    moved in as `checkpoint/`) is the state before the step. Returns `directory`."""
    from safetensors.torch import save_file

    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        files: dict[str, FileEntry] = {}
        for rank, tensors in enumerate(rank_tensors):
            name = rank_file(rank)
            flat = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
            save_file(flat, str(tmp / name))
            files[name] = FileEntry(
                sha256=_sha256(tmp / name),
                bytes=(tmp / name).stat().st_size,
                tensors={k: TensorEntry(_NAMES[v.dtype], list(v.shape)) for k, v in flat.items()},
            )
        if checkpoint is not None:
            shutil.move(str(checkpoint), str(tmp / CHECKPOINT_DIR))
        meta = msgspec.structs.replace(record, files=files)
        (tmp / RECORD_NAME).write_bytes(msgspec.json.format(msgspec.json.encode(meta)))
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def record_size(directory: Path) -> int:
    """Bytes of a record's files (tensor files and metadata; the checkpoint apart)."""
    return sum(
        p.stat().st_size for p in directory.iterdir() if p.is_file() and p.name != CHECKPOINT_DIR
    )


def read_meta(directory: Path) -> StepRecord:
    path = directory / RECORD_NAME
    if not path.is_file():
        raise RecordError(f"{directory}: no {RECORD_NAME} (not a step record)")
    size = path.stat().st_size
    if size > MAX_META_BYTES:
        raise RecordError(f"{path}: {size} bytes, over the {MAX_META_BYTES} a record may have")
    try:
        meta = msgspec.json.decode(path.read_bytes(), type=StepRecord)
    except msgspec.ValidationError as err:
        raise RecordError(f"{path}: malformed record: {err}") from None
    except msgspec.DecodeError as err:
        raise RecordError(f"{path}: not JSON: {err}") from None
    if meta.format != FORMAT:
        raise RecordError(f"{path}: record format {meta.format}, this reader knows {FORMAT}")
    if meta.trainer.world_size < 1 or sorted(meta.files) != sorted(
        rank_file(r) for r in range(meta.trainer.world_size)
    ):
        raise RecordError(
            f"{path}: files {sorted(meta.files)} do not match world_size "
            f"{meta.trainer.world_size} (one rank<r>.safetensors per rank)"
        )
    return meta


def _check_file(directory: Path, name: str, entry: FileEntry) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    path = directory / name
    if path.is_symlink() or not path.is_file():
        raise RecordError(f"{path}: missing (or not a plain file)")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES or size != entry.bytes:
        raise RecordError(f"{path}: {size} bytes, the record says {entry.bytes}")
    if len(entry.tensors) > MAX_TENSORS:
        raise RecordError(f"{path}: {len(entry.tensors)} tensors, over {MAX_TENSORS}")
    if _sha256(path) != entry.sha256:
        raise RecordError(f"{path}: sha256 does not match the record (tampered or corrupt)")
    out: dict[str, torch.Tensor] = {}
    with safe_open(str(path), framework="pt") as f:
        keys = sorted(f.keys())
        if keys != sorted(entry.tensors):
            raise RecordError(f"{path}: tensors {keys}, the record says {sorted(entry.tensors)}")
        for key in keys:
            want = entry.tensors[key]
            if want.dtype not in DTYPES:
                raise RecordError(f"{path}: {key} has dtype {want.dtype}, not one a record holds")
            t = f.get_tensor(key)
            if t.dtype != DTYPES[want.dtype] or list(t.shape) != want.shape:
                raise RecordError(
                    f"{path}: {key} is {t.dtype} {list(t.shape)}, the record says "
                    f"{want.dtype} {want.shape}"
                )
            out[key] = t
    return out


def read_record(directory: Path) -> tuple[StepRecord, list[dict[str, torch.Tensor]]]:
    """A record's metadata and each rank's tensors, validated (see the module docstring)."""
    meta = read_meta(directory)
    tensors = [
        _check_file(directory, rank_file(r), meta.files[rank_file(r)])
        for r in range(meta.trainer.world_size)
    ]
    if not (directory / CHECKPOINT_DIR).is_dir():
        raise RecordError(f"{directory}: no {CHECKPOINT_DIR}/ (the state before the step)")
    return meta, tensors


def split_rank_tensors(tensors: Mapping[str, torch.Tensor]) -> tuple[dict, torch.Tensor | None]:
    """(the batch `{key: tensor}`, the RNG state) of one rank's record tensors."""
    batch = {k.removeprefix("batch."): v for k, v in tensors.items() if k.startswith("batch.")}
    return batch, tensors.get("rng.torch")


def is_finite_metric(value: float) -> bool:
    return math.isfinite(value)
