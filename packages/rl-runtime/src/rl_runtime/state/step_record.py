"""A recorded learn call (`rl-replay`'s input): what one `train_step` of a role consumed and
reported, under `output_dir/records/step-<N>/<role>/`:

- `record.json`: a `StepRecord` (msgspec JSON): the step, role, weight version, config hash,
  how the trainer was built (strategy, model path, training/model/loss arguments), the rank-0
  metrics the trainer returned (as `float.hex` strings: NaN and inf survive), the weight checksum
  after the step, and each tensor file's sha256, size, tensor names, dtypes and shapes;
- `rank<r>.safetensors`: rank r's rows of the collated batch (`batch.<key>`, each `[B_r, ...]`)
  and its torch RNG state before the step (`rng.torch`, uint8);
- `checkpoint/`: the role's training checkpoint of the state before the step (rl_train's layout,
  signed manifest), what the replay rebuilds the trainer from;
- `MANIFEST.json` / `MANIFEST.hmac`: the record's own signed manifest (rl_train.signing, the
  checkpoints' scheme and key): size and sha256 of every file above, the checkpoint's included,
  signed for the record's step.

Nothing is pickled. A record directory is untrusted input: `read_record` first checks the signed
manifest (its MAC under the run's checkpoint key, that it was signed for the step its `step-<N>`
directory is named by, every file's size and sha256, no unlisted file, no symlink), then reads
`record.json` and each tensor file once, through the verified hashes, bounds every size and
checks each tensor's name, dtype and shape against `record.json`; any mismatch is refused
naming the file.
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
#: 2: records are signed (MANIFEST.json / MANIFEST.hmac)
FORMAT = 2
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
    #: the step whose record holds `checkpoint/`, the state this replay starts from: this one's
    #: own, or (a chain of `every:1` records) an earlier one's
    base_step: int
    #: the records from `base_step` to this one's step - 1, which the replay trains on first:
    #: `{step: sha256 of that record's MANIFEST.json}` (binding their signed contents)
    previous: dict[str, str]

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
        if t.numel():  # the tensor's own bytes, hashed in place (no copy)
            h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


def rng_tensor() -> torch.Tensor:
    """This process's torch CPU RNG state, `[N]` uint8."""
    return torch.get_rng_state()


def rank_file(rank: int) -> str:
    return f"rank{rank}.safetensors"


def write_record(
    directory: Path,
    record: StepRecord,
    rank_tensors: list[dict[str, torch.Tensor]],
    checkpoint: Path | None,
    *,
    key_file: str | os.PathLike[str] | None,
) -> Path:
    """Write `record` (its `files` filled here) and each rank's tensors into `directory`
    atomically: a temporary sibling, fsynced and signed (rl_train.signing's manifest under the
    checkpoint key `key_file`, for `record.step`), renamed into place. `checkpoint` (a role
    checkpoint root, moved in as `checkpoint/`) is the state before the step. Returns
    `directory`."""
    from safetensors.torch import save

    from rl_train.durable import fsync_path, fsync_tree, write_durable
    from rl_train.signing import load_key, write_manifest

    key = load_key(key_file, checkpoint_root=directory.parent.parent)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        files: dict[str, FileEntry] = {}
        for rank, tensors in enumerate(rank_tensors):
            name = rank_file(rank)
            flat = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
            data = save(flat)
            write_durable(tmp / name, data)
            files[name] = FileEntry(
                sha256=hashlib.sha256(data).hexdigest(),
                bytes=len(data),
                tensors={k: TensorEntry(_NAMES[v.dtype], list(v.shape)) for k, v in flat.items()},
            )
        if checkpoint is not None:
            shutil.move(str(checkpoint), str(tmp / CHECKPOINT_DIR))
            fsync_tree(tmp / CHECKPOINT_DIR)
        meta = msgspec.structs.replace(record, files=files)
        write_durable(tmp / RECORD_NAME, msgspec.json.format(msgspec.json.encode(meta)))
        write_manifest(tmp, key, step=record.step)
        fsync_path(tmp)
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
        fsync_path(directory.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def manifest_sha256(directory: Path) -> str:
    """sha256 of a record's `MANIFEST.json` (which names every file's sha256): what a later
    record of the same chain binds it by."""
    from rl_train.signing import MANIFEST, sha256_file

    return sha256_file(directory / MANIFEST)


def record_size(directory: Path) -> int:
    """Bytes of a record's files (tensor files, metadata and manifest; the checkpoint apart)."""
    return sum(
        p.stat().st_size for p in directory.iterdir() if p.is_file() and p.name != CHECKPOINT_DIR
    )


def verify_record(directory: Path, key_file: str | os.PathLike[str] | None) -> dict[str, str]:
    """Check the record's signed manifest (rl_train.signing.verify_manifest): its MAC under the
    checkpoint key `key_file`, that it was signed for the step of the `step-<N>` directory above
    `directory`, every file's size and sha256 (the checkpoint's too), no unlisted file and no
    symlink. Returns `{relative path: sha256}`; a failure is a RecordError naming the file."""
    from rl_train.checkpoint_store import dir_step
    from rl_train.signing import MANIFEST, CheckpointError, load_key, verify_manifest

    if directory.is_symlink() or not directory.is_dir():
        raise RecordError(f"{directory}: not a record directory (or a symlink)")
    if not (directory / MANIFEST).is_file():
        raise RecordError(
            f"{directory}: no {MANIFEST}: the record is not signed (written before records "
            "were signed, or not by this stack), so it cannot be vouched for"
        )
    try:
        key = load_key(key_file, create=False)
        return verify_manifest(directory, key, step=dir_step(directory.parent))
    except CheckpointError as err:
        text = str(err).replace(f"checkpoint {directory}: ", "", 1)
        raise RecordError(f"record {directory}: {text}") from None


def _verified_bytes(directory: Path, name: str, files: Mapping[str, str], limit: int) -> bytes:
    """The bytes of `name`, read once and checked against the verified manifest's sha256 (a
    file swapped after the verification is refused, never parsed)."""
    from rl_train.signing import CheckpointError, read_bounded

    if name not in files:
        raise RecordError(f"{directory / name}: not in the record's signed manifest")
    try:
        data = read_bounded(directory / name, limit, directory)
    except CheckpointError as err:
        raise RecordError(f"{directory / name}: {err}") from None
    if hashlib.sha256(data).hexdigest() != files[name]:
        raise RecordError(f"{directory / name}: changed after the record was verified")
    return data


def _decode_meta(path: Path, data: bytes) -> StepRecord:
    try:
        meta = msgspec.json.decode(data, type=StepRecord)
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
    if not 1 <= meta.base_step <= meta.step or sorted(meta.previous, key=int) != [
        str(s) for s in range(meta.base_step, meta.step)
    ]:
        raise RecordError(
            f"{path}: base_step {meta.base_step} and previous {sorted(meta.previous)} do not "
            f"chain to step {meta.step}"
        )
    return meta


def _read_meta(directory: Path, files: Mapping[str, str]) -> StepRecord:
    from rl_train.checkpoint_store import dir_step

    path = directory / RECORD_NAME
    meta = _decode_meta(path, _verified_bytes(directory, RECORD_NAME, files, MAX_META_BYTES))
    if meta.step != dir_step(directory.parent) or meta.role != directory.name:
        raise RecordError(
            f"{path}: a record of step {meta.step}, role {meta.role!r}, found as "
            f"{directory.parent.name}/{directory.name}: renamed or moved"
        )
    return meta


def read_meta(directory: Path, key_file: str | os.PathLike[str] | None = None) -> StepRecord:
    """The record's metadata, once its signed manifest verified (`verify_record`)."""
    return _read_meta(directory, verify_record(directory, key_file))


def _check_file(
    directory: Path, name: str, entry: FileEntry, files: Mapping[str, str]
) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    path = directory / name
    if len(entry.tensors) > MAX_TENSORS:
        raise RecordError(f"{path}: {len(entry.tensors)} tensors, over {MAX_TENSORS}")
    data = _verified_bytes(directory, name, files, MAX_FILE_BYTES)
    if len(data) != entry.bytes or files[name] != entry.sha256:
        raise RecordError(f"{path}: size or sha256 not as {RECORD_NAME} says")
    try:
        loaded = load(data)
    except Exception as err:  # safetensors raises its own error types
        raise RecordError(f"{path}: not a safetensors file: {err}") from None
    keys = sorted(loaded)
    if keys != sorted(entry.tensors):
        raise RecordError(f"{path}: tensors {keys}, the record says {sorted(entry.tensors)}")
    for key in keys:
        want, t = entry.tensors[key], loaded[key]
        if want.dtype not in DTYPES:
            raise RecordError(f"{path}: {key} has dtype {want.dtype}, not one a record holds")
        if t.dtype != DTYPES[want.dtype] or list(t.shape) != want.shape:
            raise RecordError(
                f"{path}: {key} is {t.dtype} {list(t.shape)}, the record says "
                f"{want.dtype} {want.shape}"
            )
    return loaded


def read_record(
    directory: Path, key_file: str | os.PathLike[str] | None = None
) -> tuple[StepRecord, list[dict[str, torch.Tensor]]]:
    """A record's metadata and each rank's tensors, validated (see the module docstring);
    `key_file` is the run's checkpoint key (None: the default one)."""
    files = verify_record(directory, key_file)
    meta = _read_meta(directory, files)
    tensors = [
        _check_file(directory, rank_file(r), meta.files[rank_file(r)], files)
        for r in range(meta.trainer.world_size)
    ]
    own = (directory / CHECKPOINT_DIR).is_dir()
    if own != (meta.base_step == meta.step):
        raise RecordError(
            f"{directory}: {'a' if own else 'no'} {CHECKPOINT_DIR}/, but the record's base step "
            f"is {meta.base_step} (its own step {meta.step} holds the state before it iff equal)"
        )
    return meta, tensors


def read_chain(
    directory: Path, meta: StepRecord, key_file: str | os.PathLike[str] | None = None
) -> list[tuple[Path, StepRecord, list[dict[str, torch.Tensor]]]]:
    """The records `meta`'s replay trains on before its own step (`meta.previous`, oldest
    first): each verified (`read_record`), bound by its manifest's sha256, of the same run and
    trainer; the first holds the checkpoint. [] for a record with its own checkpoint."""
    out = []
    for step in range(meta.base_step, meta.step):
        other = directory.parent.parent / f"step-{step}" / directory.name
        if not (other / RECORD_NAME).is_file():
            raise RecordError(
                f"{directory}: starts from the state of step {meta.base_step}'s record and needs "
                f"every record since; {other} is missing"
            )
        record, tensors = read_record(other, key_file)
        if manifest_sha256(other) != meta.previous[str(step)]:
            raise RecordError(
                f"{other}: its MANIFEST.json is not the one {directory / RECORD_NAME} was "
                "chained to (replaced)"
            )
        if record.trainer != meta.trainer or record.config_hash != meta.config_hash:
            raise RecordError(f"{other}: of another run or trainer than {directory}")
        if step == meta.base_step and record.base_step != step:
            raise RecordError(f"{other}: holds no checkpoint, but {directory} starts from it")
        out.append((other, record, tensors))
    return out


def split_rank_tensors(tensors: Mapping[str, torch.Tensor]) -> tuple[dict, torch.Tensor | None]:
    """(the batch `{key: tensor}`, the RNG state) of one rank's record tensors."""
    batch = {k.removeprefix("batch."): v for k, v in tensors.items() if k.startswith("batch.")}
    return batch, tensors.get("rng.torch")


def is_finite_metric(value: float) -> bool:
    return math.isfinite(value)
