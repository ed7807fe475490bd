"""Resumable checkpoints with torch.distributed.checkpoint (DCP) for plain and FSDP2 modules:
model + optimizer (sharded per rank), scheduler, step, guard counters and every rank's RNG.

DCP's ``.metadata`` is a pickle and it reads byte items with an unrestricted ``torch.load``,
so a load reads only files whose hashes rank 0 verified against the signed manifest, each hashed
again through the descriptor DCP then reads (:class:`_VerifiedFileSystem`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rl_train import checkpoint as ckpt

KeyFile = str | os.PathLike[str] | None


class _VerifiedFileSystem(FileSystem):
    """DCP's local filesystem, but every stream it opens for reading is a verified one."""

    def __init__(self, ckpt_dir: Path, files: dict[str, str]) -> None:
        self.ckpt_dir, self.files = ckpt_dir, files

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        if mode != "rb":
            raise ckpt.CheckpointError(f"checkpoint {self.ckpt_dir}: refusing to write {path}")
        with ckpt.open_verified(self.ckpt_dir, Path(path), self.files) as f:
            yield f


def _state(backend: Any) -> dict[str, Any]:
    if backend.optimizer is None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return {"model": get_model_state_dict(backend.model)}
    model_sd, optim_sd = get_state_dict(backend.model, backend.optimizer)
    return {"model": model_sd, "optim": optim_sd}


def trainer_state(backend: Any, step: int, extra: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "step": step,
        "global_step": backend.global_step,
        "role": backend.role,
        "strategy": backend.strategy_name,
        "world_size": backend.world_size,
        "scheduler": None if backend.scheduler is None else backend.scheduler.state_dict(),
        "guard": {"consecutive": backend.guard.consecutive, "total": backend.guard.total_skipped},
        "extra": extra or {},
    }


def restore_trainer_state(backend: Any, state: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    if state["world_size"] != backend.world_size and backend.strategy_name == "deepspeed_train":
        raise ckpt.CheckpointError(
            f"checkpoint was written by {state['world_size']} ranks, this job has {backend.world_size}"
        )
    backend.global_step = int(state["global_step"])
    if backend.scheduler is not None and state.get("scheduler") is not None:
        backend.scheduler.load_state_dict(state["scheduler"])
    backend.guard.consecutive = int(state["guard"]["consecutive"])
    backend.guard.total_skipped = int(state["guard"]["total"])
    return int(state["step"]), dict(state.get("extra") or {})


def save(
    backend: Any, root: str | Path, step: int, extra: dict[str, Any] | None, key_file: KeyFile
) -> Path:
    tmp = ckpt.begin(root, step)
    dcp.save(_state(backend), checkpoint_id=str(tmp / "model_optim"))
    ckpt.save_rng(tmp, backend.device_kind)
    ckpt.save_json(tmp / "trainer_state.json", trainer_state(backend, step, extra))
    return ckpt.commit(root, step, tmp, keep_last=backend.keep_last, key_file=key_file)


def load(backend: Any, root: str | Path, key_file: KeyFile) -> tuple[int, dict[str, Any]]:
    def _load(path: Path, report: ckpt.LoadReport) -> tuple[int, dict[str, Any]]:
        state = ckpt.load_json(path / "trainer_state.json", report.files)
        sd = _state(backend)
        reader = FileSystemReader(path / "model_optim")
        reader.fs = _VerifiedFileSystem(path, report.files)
        dcp.load(sd, storage_reader=reader)
        if backend.optimizer is None:
            from torch.distributed.checkpoint.state_dict import set_model_state_dict

            set_model_state_dict(backend.model, sd["model"])
        else:
            set_state_dict(
                backend.model,
                backend.optimizer,
                model_state_dict=sd["model"],
                optim_state_dict=sd["optim"],
            )
        ckpt.load_rng(path, backend.device_kind, report.files)
        return restore_trainer_state(backend, state)

    result, report = ckpt.load_newest_valid(root, _load, key_file=key_file)
    backend.last_load_report = report
    return result
