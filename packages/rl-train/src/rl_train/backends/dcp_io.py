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
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from rl_train import checkpoint as ckpt
from rl_train import dist as rdist
from rl_train.optim import apply_configured_settings

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


def _options(backend: Any) -> StateDictOptions | None:
    """With LoRA adapters only the trained parameters (the adapter, a critic's value head) are
    saved and loaded: the frozen base weights come from the model directory, as at the start."""
    if not getattr(backend, "has_adapters", False):
        return None
    return StateDictOptions(ignore_frozen_params=True, strict=False)


def _state(backend: Any, *, optimizer: bool = True) -> dict[str, Any]:
    """What a checkpoint holds: the model's state dict (with LoRA, its trained parameters only:
    :func:`_options`), and the optimizer's unless ``optimizer`` is False or there is none (DCP's
    flattened keys ``model.<fqn>``, ``optim.state.<fqn>.<key>``, ``optim.param_groups.<fqn>.<key>``)."""
    if backend.optimizer is None or not optimizer:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        model_sd = get_model_state_dict(backend.model, options=_options(backend))
        return {"model": _trained_only(backend, model_sd)}
    model_sd, optim_sd = get_state_dict(backend.model, backend.optimizer, options=_options(backend))
    return {"model": _trained_only(backend, model_sd), "optim": optim_sd}


def _trained_only(backend: Any, model_sd: dict[str, Any]) -> dict[str, Any]:
    """With :func:`_options`, also drop a frozen tied weight's second name (DCP keeps
    ``lm_head.weight`` when it drops the tied ``model.embed_tokens.weight``)."""
    if _options(backend) is None:
        return model_sd
    params = backend.model.named_parameters(remove_duplicate=False)
    trained = {name for name, param in params if param.requires_grad}
    return {key: value for key, value in model_sd.items() if key in trained}


def _has_optimizer_state(backend: Any) -> bool:
    """Whether the optimizer holds state (Adam's moments and step counts): none before its first
    step, nor after `optimizer.state.clear()` (a schedule restarted after a supervised warm-up).
    Such an optimizer is saved as nothing: DCP's `get_state_dict` would otherwise run a step at
    rate 0 to create zero moments (and so change the training that follows), or, where gradients
    are left over, save groups without state that no fresh optimizer could load."""
    return backend.optimizer is not None and bool(backend.optimizer.state)


def _saved_optimizer_state(reader: FileSystemReader) -> bool:
    """Whether the checkpoint read by ``reader`` holds optimizer state (``optim.state.*`` keys):
    not one saved without it, nor one with only the groups' settings (``optim.param_groups.*``:
    written, before this was checked, by an optimizer that had gradients but no state)."""
    keys = reader.read_metadata().state_dict_metadata
    return any(key.startswith("optim.state.") for key in keys)


def check_same_model(ckpt_dir: Path, reader: FileSystemReader, model_sd: dict[str, Any]) -> None:
    """Refuse a checkpoint of another model before anything loads: DCP loads only the keys the
    model asks for (a checkpoint of a deeper model loaded silently into its first layers), and
    raised a bare "Missing key" or size error from its planner for the rest. A CheckpointError
    naming how many parameters are missing, extra or of another shape, and the first of each."""
    saved = {key.removeprefix("model."): tuple(getattr(meta, "size", ()))
             for key, meta in reader.read_metadata().state_dict_metadata.items()
             if key.startswith("model.")}  # fmt: skip
    wanted = {key: tuple(tensor.shape) for key, tensor in model_sd.items()}
    missing = [k for k in wanted if k not in saved]
    extra = [k for k in saved if k not in wanted]
    reshaped = [k for k in wanted if k in saved and saved[k] != wanted[k]]
    if not (missing or extra or reshaped):
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} of this model's parameters missing (first {missing[0]})")
    if extra:
        parts.append(f"{len(extra)} parameters this model lacks (first {extra[0]})")
    if reshaped:
        k = reshaped[0]
        parts.append(
            f"{len(reshaped)} of another shape (first {k}: {list(saved[k])} saved, "
            f"{list(wanted[k])} here)"
        )
    raise ckpt.CheckpointError(
        f"checkpoint {ckpt_dir} holds another model than this run's: {'; '.join(parts)}"
    )


def save_adapter_config(backend: Any, tmp: Path) -> None:
    """A LoRA role's checkpoint carries its peft ``adapter_config.json`` (rank, alpha, targets):
    what exporting it (rl_train.checkpoint_export) merges with."""
    if not getattr(backend, "has_adapters", False) or rdist.rank() != 0:
        return
    from rl_train.lora import peft_config

    config = peft_config(backend.model_args.lora, backend.model_path, backend.role)
    config.save_pretrained(str(tmp))


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
    if backend.optimizer is not None and backend.scheduler is not None:
        apply_configured_settings(backend.optimizer, backend.scheduler, backend.args)
    backend.guard.consecutive = int(state["guard"]["consecutive"])
    backend.guard.total_skipped = int(state["guard"]["total"])
    return int(state["step"]), dict(state.get("extra") or {})


def save(
    backend: Any, root: str | Path, step: int, extra: dict[str, Any] | None, key_file: KeyFile
) -> Path:
    tmp = ckpt.begin(root, step)
    sd = _state(backend, optimizer=_has_optimizer_state(backend))
    dcp.save(sd, checkpoint_id=str(tmp / "model_optim"))
    save_adapter_config(backend, tmp)
    ckpt.save_rng(tmp, backend.device_kind)
    ckpt.save_json(tmp / "trainer_state.json", trainer_state(backend, step, extra))
    return ckpt.commit(root, step, tmp, keep_last=backend.keep_last, key_file=key_file)


def load(backend: Any, root: str | Path, key_file: KeyFile) -> tuple[int, dict[str, Any]]:
    def _load(path: Path, report: ckpt.LoadReport) -> tuple[int, dict[str, Any]]:
        state = ckpt.load_json(path / "trainer_state.json", report.files)
        reader = FileSystemReader(path / "model_optim")
        reader.fs = _VerifiedFileSystem(path, report.files)
        # without saved optimizer state, the optimizer stays as built (no state, like the saved one)
        sd = _state(backend, optimizer=_saved_optimizer_state(reader))
        check_same_model(path, reader, sd["model"])
        dcp.load(sd, storage_reader=reader)
        if "optim" not in sd:
            from torch.distributed.checkpoint.state_dict import set_model_state_dict

            set_model_state_dict(backend.model, sd["model"], options=_options(backend))
            if backend.optimizer is not None:
                backend.optimizer.state.clear()
        else:
            set_state_dict(
                backend.model,
                backend.optimizer,
                model_state_dict=sd["model"],
                optim_state_dict=sd["optim"],
                options=_options(backend),
            )
        ckpt.load_rng(path, backend.device_kind, report.files)
        return restore_trainer_state(backend, state)

    result, report = ckpt.load_newest_valid(root, _load, key_file=key_file)
    backend.last_load_report = report
    return result
