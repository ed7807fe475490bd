"""HF export: gather full tensors (every rank takes part) and ``save_pretrained`` them from rank 0
as safetensors into a directory transformers and vLLM load; written atomically (tmp + rename)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from rl_train import dist as rdist

_WRAPPER_PREFIXES = (
    "_checkpoint_wrapped_module.",
    "_fsdp_wrapped_module.",
    "_orig_mod.",
    "module.",
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
)


def hf_name(name: str) -> str:
    """Strip wrapper prefixes (activation checkpointing, FSDP1, torch.compile, DDP) from a name."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def full_tensors_from_module(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named full tensors of ``module``'s state dict (DTensor shards are all-gathered)."""
    for name, tensor in module.state_dict().items():
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor  # type: ignore[union-attr]
        yield hf_name(name), full.detach()


def export_hf(backend: Any, out_dir: Path) -> Path:
    state: dict[str, torch.Tensor] = {}
    for bucket in backend.iter_full_tensor_buckets():
        if rdist.rank() == 0:
            for name, tensor in bucket:
                state[name] = tensor.to("cpu", copy=True)
    if rdist.rank() == 0:
        _save_pretrained(
            backend.hf_model_class,
            backend.hf_config,
            state,
            out_dir,
            source_dir=Path(backend.model_path),
        )
    rdist.barrier()
    return out_dir


def save_state_as_hf(backend: Any, state: dict[str, torch.Tensor], out_dir: Path) -> Path:
    """Write ``state`` (HF-named full tensors, e.g. another model's ``named_tensors``) as an HF
    directory of ``backend``'s architecture and config (``config.json``, ``model.safetensors``)
    with its tokenizer files; atomically, on whichever rank calls it (transformers'
    ``save_pretrained`` writes on rank 0 only). Every parameter must be in ``state`` (a tied one
    under its first name)."""
    from safetensors.torch import save_file

    _model_with(backend.hf_model_class, backend.hf_config, state)  # every parameter is there
    tmp = _fresh_tmp(out_dir)
    backend.hf_config.save_pretrained(str(tmp))
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in state.items()}
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    _finish(tmp, out_dir, Path(backend.model_path))
    return out_dir


def _model_with(model_class: Any, config: Any, state: dict[str, torch.Tensor]) -> Any:
    """A model of ``model_class``/``config`` holding ``state`` (assigned, not copied); raises
    naming the parameters ``state`` lacks."""
    with torch.device("meta"):
        model = model_class._from_config(config)
    model.load_state_dict(state, strict=False, assign=True)
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise RuntimeError(f"export_hf: no tensor gathered for {missing[:5]}")
    return model


def _fresh_tmp(out_dir: Path) -> Path:
    tmp = out_dir.parent / f".tmp_{out_dir.name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def _finish(tmp: Path, out_dir: Path, source_dir: Path | None) -> None:
    """Copy the tokenizer files of ``source_dir`` into ``tmp``, then put ``tmp`` in place of
    ``out_dir``."""
    if source_dir is not None and source_dir.is_dir():
        for name in TOKENIZER_FILES:
            src = source_dir / name
            if src.is_file() and not (tmp / name).exists():
                shutil.copy2(src, tmp / name)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)


def _save_pretrained(
    model_class: Any,
    config: Any,
    state: dict[str, torch.Tensor],
    out_dir: Path,
    source_dir: Path | None,
) -> None:
    model = _model_with(model_class, config, state)
    tmp = _fresh_tmp(out_dir)
    model.save_pretrained(str(tmp), safe_serialization=True)
    _finish(tmp, out_dir, source_dir)
