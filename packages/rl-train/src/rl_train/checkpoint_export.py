"""A training checkpoint as a Hugging Face model directory, without starting a trainer.

    weights = checkpoint_weights(ckpt_dir)          # verified first, every backend's format
    export_weights(weights, base_model, out_dir)     # config.json, model.safetensors, tokenizer
    export_adapter_dir(ckpt_dir, out_dir)            # a LoRA checkpoint: a peft adapter directory

A checkpoint directory is untrusted input: `checkpoint_weights` verifies it (the COMMITTED
marker, the signed manifest, every file's hash: :func:`rl_train.checkpoint.verify`) before
anything in it is read, and reads each file through a descriptor whose hash it checks again
(:func:`rl_train.checkpoint.open_verified`), so a file swapped after the verification is never
unpickled. Formats:

- ``model_optim/`` (native and FSDP2 strategies, torch.distributed.checkpoint): the model's
  tensors only (``model.*``), each assembled from every rank's shards, on the CPU, in this one
  process (no process group);
- ``deepspeed/state/`` (DeepSpeed): ZeRO-0/1/2 keep the full module in
  ``mp_rank_00_model_states.pt``, read as the trainer computes with it; ZeRO-3 keeps only
  partitions (``zero_pp_rank_<r>_mp_rank_00_*``), merged by DeepSpeed's ``zero_to_fp32`` from a private copy of the verified files.

The steps between reading and writing run in `EXPORT_STEPS` order, each `(weights, checkpoint,
verified files) -> weights`: a LoRA checkpoint's adapter becomes an adapter payload (`scale_adapters`), which
`export_weights` merges into the base model's weights.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from rl_train import checkpoint as ckpt
from rl_train.export import _finish, _fresh_tmp, _model_with, hf_name

KeyFile = str | os.PathLike[str] | None
Weights = dict[str, torch.Tensor]
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def checkpoint_weights(ckpt_dir: str | os.PathLike[str], *, key_file: KeyFile = None) -> Weights:
    """HF-named full tensors (CPU) of the model in the training checkpoint ``ckpt_dir`` (a
    ``step-<N>`` directory an rl_train backend saved), after verifying it; a
    :class:`~rl_train.signing.CheckpointError` naming the first problem otherwise."""
    path = Path(ckpt_dir)
    files = ckpt.verify(path, key_file=key_file)
    weights = _saved_weights(path, files)
    for step in EXPORT_STEPS:
        weights = step(weights, path, files)
    return weights


def _saved_weights(path: Path, files: dict[str, str]) -> Weights:
    """The HF-named tensors the verified checkpoint ``path`` holds, as saved (with LoRA: the
    adapter under peft's module names, and a critic's value head)."""
    if (path / "model_optim").is_dir():
        return _dcp_weights(path, files)
    if (path / "deepspeed").is_dir():
        return _deepspeed_weights(path, files)
    raise ckpt.CheckpointError(
        f"checkpoint {path} holds neither model_optim/ (native, FSDP2) nor deepspeed/"
    )


def _dcp_weights(path: Path, files: dict[str, str]) -> Weights:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from rl_train.backends.dcp_io import _VerifiedFileSystem

    reader = FileSystemReader(path / "model_optim")
    reader.fs = _VerifiedFileSystem(path, files)
    wanted = {
        key.removeprefix("model."): torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        for key, meta in reader.read_metadata().state_dict_metadata.items()
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    }
    if not wanted:
        raise ckpt.CheckpointError(f"checkpoint {path}: model_optim/ holds no model tensors")
    state = {"model": wanted}
    dcp.load(state, storage_reader=reader, no_dist=True)
    return {hf_name(name): tensor for name, tensor in state["model"].items()}


def _deepspeed_weights(path: Path, files: dict[str, str]) -> Weights:
    tag = path / "deepspeed" / "state"
    model_file = tag / "mp_rank_00_model_states.pt"
    if not model_file.is_file():  # ZeRO-3: every rank's partition, zero_pp_rank_<r>_mp_rank_00_*
        if (tag / "zero_pp_rank_0_mp_rank_00_model_states.pt").is_file():
            return _zero3_weights(path, files)
        raise ckpt.CheckpointError(f"checkpoint {path}: no {model_file.relative_to(path)}")
    with ckpt.open_verified(path, model_file, files) as f:
        saved = torch.load(  # unsafe-pattern-ok: DeepSpeed's pickle, verified and signed
            f, map_location="cpu", weights_only=False
        )
    stage = int(((saved.get("ds_config") or {}).get("zero_optimization") or {}).get("stage", 0))
    if stage < 3:
        return {hf_name(k): v.detach().clone() for k, v in saved["module"].items()}
    return _zero3_weights(path, files)


def _zero3_weights(path: Path, files: dict[str, str]) -> Weights:
    """DeepSpeed's zero_to_fp32 on a private copy of the verified ``deepspeed/`` files (it
    reads them with its own unrestricted ``torch.load``; the copy is made through verified
    descriptors, in a directory only this process knows)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with tempfile.TemporaryDirectory(prefix="rl-export-") as tmp:
        private = Path(tmp) / "deepspeed"
        for rel in files:
            if not rel.startswith("deepspeed/"):
                continue
            target = Path(tmp) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with ckpt.open_verified(path, path / rel, files) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
        state = get_fp32_state_dict_from_zero_checkpoint(str(private), tag="state")
    return {hf_name(k): v.detach().clone() for k, v in state.items()}


def scale_adapters(weights: Weights, checkpoint: Path, files: dict[str, str]) -> Weights:
    """A LoRA checkpoint (its adapter and the other trained tensors only; the base weights are
    the model's it started from) as an adapter payload (:mod:`rl_sync.adapter`: each module's A
    and ``alpha / r`` times B), the scale read from the checkpoint's verified
    ``adapter_config.json``; :func:`export_weights` merges it into the base model. Other
    checkpoints pass unchanged."""
    from rl_sync.adapter import payload_names
    from rl_train.lora import ADAPTER_NAME, scaled_b

    parts: dict[str, dict[str, torch.Tensor]] = {}
    out: Weights = {}
    for name, tensor in weights.items():
        for part in ("lora_A", "lora_B"):
            marker = f".{part}.{ADAPTER_NAME}.weight"
            if name.endswith(marker):
                parts.setdefault(name.removesuffix(marker), {})[part] = tensor
                break
        else:
            out[name] = tensor
    if not parts:
        return weights
    config = _adapter_config(checkpoint, files)
    rank, alpha = int(config["r"]), float(config["lora_alpha"])
    scale = alpha / (rank**0.5 if config.get("use_rslora") else rank)
    for module, pair in parts.items():
        if set(pair) != {"lora_A", "lora_B"}:
            raise ckpt.CheckpointError(f"checkpoint {checkpoint}: adapter of {module} incomplete")
        a_name, b_name = payload_names(module)
        out[a_name], out[b_name] = pair["lora_A"], scaled_b(pair["lora_B"], scale)
    return out


def _adapter_config(checkpoint: Path, files: dict[str, str]) -> dict[str, Any]:
    """The verified checkpoint's ``adapter_config.json`` (``files``: what it verified)."""
    import json

    path = checkpoint / "adapter_config.json"
    if ADAPTER_CONFIG not in files:
        raise ckpt.CheckpointError(f"checkpoint {checkpoint} holds LoRA tensors but no {path.name}")
    with ckpt.open_verified(checkpoint, path, files) as f:
        return json.loads(f.read())


EXPORT_STEPS: list[Callable[[Weights, Path, dict[str, str]], Weights]] = [scale_adapters]
"""What runs on a checkpoint's weights between reading and writing, in order."""


def _merged_into_base(weights: Weights, base: Path, config: Any, model_class: Any) -> Weights:
    """``weights`` holding an adapter payload (:func:`scale_adapters`) on top of the base
    model's own weights: each adapted ``<module>.weight`` is ``W0 + B @ A``
    (:func:`rl_sync.adapter.merge`), every other tensor of ``weights`` replaces the base's."""
    from rl_sync.adapter import adapter_part, merge

    factors: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights.items():
        part = adapter_part(name)
        if part is not None:
            factors.setdefault(part[0], {})[part[1]] = tensor
    if not factors:
        return weights
    base_model = model_class.from_pretrained(str(base), config=config, trust_remote_code=False)
    merged = {k: v.detach() for k, v in base_model.state_dict().items()}
    merged.update({k: v for k, v in weights.items() if adapter_part(k) is None})
    for module, pair in factors.items():
        name = f"{module}.weight"
        if name not in merged:
            raise ValueError(f"export: the adapter of {module} has no base weight {name}")
        merged[name] = merge(merged[name], pair["A"], pair["B"])
    return merged


def export_weights(
    weights: Weights,
    base_model: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    config_overrides: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``weights`` (HF-named full tensors) as an HF causal-LM directory of
    ``base_model``'s architecture and config, with its tokenizer files: ``config.json``,
    ``model.safetensors``, tokenizer; atomically (a temporary directory renamed into place).
    Every parameter of the architecture must be in ``weights``; a tensor it does not have is an
    error naming it. ``config_overrides``: the run's model config override
    (``model_args.model_config_kwargs``), which the written ``config.json`` carries."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rl_config.model_config import apply_model_config_overrides

    base = Path(base_model)
    if not (base / "config.json").is_file():
        raise FileNotFoundError(f"base model {base}: no config.json (a local HF model directory)")
    config = AutoConfig.from_pretrained(str(base), trust_remote_code=False)
    apply_model_config_overrides(config, config_overrides or {})
    with torch.device("meta"):
        model_class: Any = type(AutoModelForCausalLM.from_config(config))
    weights = _merged_into_base(weights, base, config, model_class)
    model = _model_with(model_class, config, weights)
    unknown = sorted(set(weights) - set(model.state_dict()))
    if unknown:
        raise ValueError(f"export: {len(unknown)} tensors the model lacks (first {unknown[0]})")
    out = Path(out_dir)
    tmp = _fresh_tmp(out)
    model.save_pretrained(str(tmp), safe_serialization=True)
    _finish(tmp, out, base)
    return out


def export_adapter_dir(
    ckpt_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    base_model: str | os.PathLike[str] | None = None,
    key_file: KeyFile = None,
) -> Path:
    """Write the LoRA adapter of the training checkpoint ``ckpt_dir`` as a peft adapter
    directory ``out_dir`` (``adapter_config.json``, ``adapter_model.safetensors``: what
    ``peft.PeftModel.from_pretrained`` and ``model_args.adapter_name_or_path`` load), verified
    first, atomically; ``base_model`` is recorded as the adapter's base model. A checkpoint
    without an adapter, or that trained more than the adapter (a critic's value head), is an
    error: a peft adapter directory holds the adapter only."""
    import json

    from safetensors.torch import save_file

    from rl_train.lora import adapter_tensors, is_adapter_name

    path = Path(ckpt_dir)
    files = ckpt.verify(path, key_file=key_file)
    weights = _saved_weights(path, files)
    others = sorted(name for name in weights if not is_adapter_name(name))
    if len(others) == len(weights):
        raise ValueError(
            f"checkpoint {path} holds no LoRA adapter (every weight was trained): export the "
            "model instead"
        )
    if others:
        raise ValueError(
            f"checkpoint {path} trained {len(others)} tensors besides its LoRA adapter (first "
            f"{others[0]}), which a peft adapter directory cannot hold: export the merged model"
        )
    config = _adapter_config(path, files)
    if base_model is not None:
        config["base_model_name_or_path"] = str(base_model)
    tensors = {k: v.contiguous() for k, v in adapter_tensors(iter(weights.items()))}
    out = Path(out_dir)
    tmp = _fresh_tmp(out)
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
    save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    _finish(tmp, out, None)
    return out
