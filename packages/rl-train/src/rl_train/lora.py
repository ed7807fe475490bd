"""LoRA adapters (``peft``, the optional extra ``rl-train[peft]``) on a trained role's model.

ROLL's keys (``model_args``): ``lora_target`` turns LoRA on (``all-linear``, a comma list of
module names, or a regular expression), ``lora_rank`` (default 8), ``lora_alpha`` (default
``2 * lora_rank``), ``lora_dropout`` (default 0) and ``adapter_name_or_path`` (start from a saved
peft adapter directory; its own rank, alpha and targets apply).

The backend keeps the HF model itself (peft replaces the targeted ``nn.Linear`` modules in place
by LoRA layers; the base weights become ``<module>.base_layer.weight``, the adapter
``<module>.lora_A.default.weight`` ``[r, in]`` and ``<module>.lora_B.default.weight``
``[out, r]``), so FSDP2, DeepSpeed, activation checkpointing and the forward code see the same
model class. Every base weight is frozen (``requires_grad=False``): only adapter parameters (and
the critic's value head ``score``, which is new) get gradients and optimizer state.

What leaves the trainer as "the model" (weight sync, HF export, a reference adopting it) is the
merged model, ``W = W0 + (alpha / r) * B @ A`` under the base names (:func:`merge_adapters`);
:func:`adapter_tensors` is the adapter alone, in peft's file naming.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

ALL_LINEAR = "all-linear"
ADAPTER_NAME = "default"
_REGEX_CHARS = ("*", "$", "|", "(")
_PARTS = re.compile(r"^(?P<module>.+)\.(?P<part>base_layer|lora_A|lora_B)\.(?P<rest>.+)$")


@dataclass(frozen=True)
class LoraSettings:
    """One role's adapter: ``rank`` r, ``alpha`` (the update is scaled by ``alpha / r``),
    ``target`` (``all-linear``, module names, or a regular expression peft matches against the
    full module names), ``dropout`` on the adapter's input, ``adapter_path`` (a peft adapter
    directory to start from)."""

    rank: int = 8
    alpha: float = 16.0
    target: str | tuple[str, ...] = ALL_LINEAR
    dropout: float = 0.0
    adapter_path: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or int(self.rank) != self.rank or self.rank < 1:
            raise ValueError(f"model_args.lora_rank must be an integer >= 1, got {self.rank!r}")
        if not float(self.alpha) > 0:
            raise ValueError(f"model_args.lora_alpha must be > 0, got {self.alpha!r}")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"model_args.lora_dropout must be in [0, 1), got {self.dropout!r}")
        if not self.target:
            raise ValueError("model_args.lora_target: no module named")

    @property
    def scaling(self) -> float:
        return float(self.alpha) / float(self.rank)


def parse_target(value: Any) -> str | tuple[str, ...]:
    """``lora_target`` as peft takes it: ``all-linear`` or a regular expression (ROLL: a value
    holding ``* $ | (``) as a string, otherwise a comma list (or a list) as a tuple of names."""
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == ALL_LINEAR or any(c in text for c in _REGEX_CHARS):
            return ALL_LINEAR if text.lower() == ALL_LINEAR else text
        names = tuple(p.strip() for p in text.split(",") if p.strip())
    elif isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        names = tuple(v.strip() for v in value if v.strip())
    else:
        raise ValueError(
            f"model_args.lora_target={value!r}: expected all-linear, a comma-separated list of "
            "module names or a regular expression"
        )
    if not names:
        raise ValueError(f"model_args.lora_target={value!r}: no module named")
    return names


def parse_lora(raw: Mapping[str, Any]) -> LoraSettings | None:
    """The adapter of a ``model_args`` mapping (ROLL's keys), or None when neither
    ``lora_target`` nor ``adapter_name_or_path`` is set (then a set ``lora_rank``,
    ``lora_alpha`` or ``lora_dropout`` is an error naming it: it would change nothing)."""
    target = raw.get("lora_target")
    adapter = raw.get("adapter_name_or_path")
    if target is None and adapter is None:
        stray = [k for k in ("lora_rank", "lora_alpha", "lora_dropout") if raw.get(k) is not None]
        if stray:
            raise ValueError(
                f"model_args.{stray[0]} is set but model_args.lora_target is not: LoRA is on "
                "only with lora_target (e.g. all-linear) or adapter_name_or_path"
            )
        return None
    rank = raw.get("lora_rank")
    rank = 8 if rank is None else rank
    alpha = raw.get("lora_alpha")
    return LoraSettings(
        rank=rank,
        alpha=float(2 * rank if alpha is None else alpha),
        target=ALL_LINEAR if target is None else parse_target(target),
        dropout=float(raw.get("lora_dropout") or 0.0),
        adapter_path=None if adapter is None else str(adapter),
    )


def _import_peft() -> Any:
    try:
        import peft
    except ImportError as err:  # pragma: no cover - depends on the extra
        raise ImportError(
            "model_args.lora_target needs the optional extra: pip install 'rl-train[peft]'"
        ) from err
    return peft


def apply_lora(model: nn.Module, settings: LoraSettings, role: str) -> nn.Module:
    """Put ``settings``' adapter on ``model`` in place (or load ``settings.adapter_path``) and
    freeze everything else; returns ``model`` (the same HF module, its target layers replaced).
    The critic's value head ``score`` is never adapted and stays trainable (it starts random)."""
    peft = _import_peft()
    if settings.adapter_path is not None:
        path = Path(settings.adapter_path)
        if not (path / "adapter_model.safetensors").is_file():
            raise ValueError(
                f"model_args.adapter_name_or_path={settings.adapter_path!r}: no "
                "adapter_model.safetensors there (a local peft adapter directory saved with "
                "safetensors is required)"
            )
        wrapped = peft.PeftModel.from_pretrained(
            model, str(path), adapter_name=ADAPTER_NAME, is_trainable=True
        )
    else:
        config = peft_config(settings, str(getattr(model, "name_or_path", "")), role)
        try:
            wrapped = peft.get_peft_model(model, config, adapter_name=ADAPTER_NAME)
        except ValueError as err:
            raise ValueError(f"model_args.lora_target={settings.target!r}: {err}") from None
    inner = wrapped.base_model.model
    if role == "critic":
        for param in inner.score.parameters():
            param.requires_grad_(True)
    if not has_adapters(inner):
        raise ValueError(f"model_args.lora_target={settings.target!r} matches no module")
    return inner


def has_adapters(model: nn.Module) -> bool:
    return next(adapter_modules(model), None) is not None


def adapter_modules(model: nn.Module) -> Iterator[tuple[str, Any]]:
    """``(name, layer)`` of every LoRA layer of ``model`` (none without peft installed)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


def scalings(model: nn.Module) -> dict[str, float]:
    """``{HF module name: alpha / r}`` of every LoRA layer (wrapper prefixes stripped)."""
    from rl_train.export import hf_name

    return {hf_name(name): float(m.scaling[ADAPTER_NAME]) for name, m in adapter_modules(model)}  # type: ignore[index]


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Within the block ``model`` computes as its base model (every LoRA layer bypassed; no
    parameter or ``requires_grad`` changes, so sharding wrappers see nothing)."""
    layers = [m for _, m in adapter_modules(model)]
    if not layers:
        raise ValueError("the model has no LoRA adapter to disable")
    before = [m._disable_adapters for m in layers]  # type: ignore[attr-defined]
    for m in layers:
        m._disable_adapters = True  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for m, flag in zip(layers, before, strict=True):
            m._disable_adapters = flag  # type: ignore[attr-defined]


def is_adapter_name(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def merge_adapters(
    named: Iterator[tuple[str, torch.Tensor]], scale: Mapping[str, float]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The merged model from a stream of HF-named full tensors of a LoRA model: each adapted
    module's ``base_layer.weight`` ``[out, in]`` + ``scale[module] * lora_B [out, r] @ lora_A
    [r, in]`` (computed in float32, cast to the base weight's dtype) as ``<module>.weight``,
    its ``base_layer.bias`` as ``<module>.bias``; other tensors pass through. Streaming: a
    module's parts are held only until all three have come."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named:
        match = _PARTS.match(name)
        if match is None:
            yield name, tensor
            continue
        module, part, rest = match["module"], match["part"], match["rest"]
        if part == "base_layer" and rest != "weight":
            yield f"{module}.{rest}", tensor  # the bias
            continue
        parts = pending.setdefault(module, {})
        parts[part] = tensor
        if len(parts) == 3:
            del pending[module]
            yield f"{module}.weight", merged_weight(parts, scale[module])
    if pending:
        raise RuntimeError(f"LoRA merge: incomplete modules {sorted(pending)[:5]}")


def scaled_b(b: torch.Tensor, scale: float) -> torch.Tensor:
    """``scale * B`` ``[out, r]`` (float32 product, B's dtype): the B an adapter payload
    carries (:mod:`rl_sync.adapter`)."""
    return (b.float() * scale).to(b.dtype)


def merged_weight(parts: Mapping[str, torch.Tensor], scale: float) -> torch.Tensor:
    """``base + (scale * B) @ A`` in float32, in the base weight's dtype ``[out, in]``: the
    arithmetic of an engine merging an adapter payload (:func:`rl_sync.adapter.merge`)."""
    from rl_sync.adapter import merge

    return merge(parts["base_layer"], parts["lora_A"], scaled_b(parts["lora_B"], scale))


def adapter_payload(
    named: Iterator[tuple[str, torch.Tensor]], scale: Mapping[str, float]
) -> Iterator[tuple[str, torch.Tensor]]:
    """An adapter-only weight payload (:mod:`rl_sync.adapter`) from a stream of HF-named full
    tensors of a LoRA model: each module's ``lora_A`` ``[r, in]`` and its ``lora_B``
    ``[out, r]`` times ``scale[module]``; nothing else (the engine keeps its base weights)."""
    from rl_sync.adapter import payload_names

    for name, tensor in named:
        match = _PARTS.match(name)
        if match is None or match["part"] == "base_layer":
            continue
        module = match["module"]
        a_name, b_name = payload_names(module)
        if match["part"] == "lora_A":
            yield a_name, tensor
        else:
            yield b_name, scaled_b(tensor, scale[module])


def peft_config(settings: LoraSettings, base_model: str, role: str) -> Any:
    """The ``peft.LoraConfig`` of ``settings`` (a loaded adapter's own, read from its
    directory), naming ``base_model``."""
    peft = _import_peft()
    if settings.adapter_path is not None:
        config = peft.LoraConfig.from_pretrained(settings.adapter_path)
    else:
        target = settings.target if isinstance(settings.target, str) else list(settings.target)
        config = peft.LoraConfig(
            r=int(settings.rank),
            lora_alpha=float(settings.alpha),
            lora_dropout=float(settings.dropout),
            target_modules=target,
            exclude_modules=["score"] if role == "critic" else None,
            bias="none",
        )
    config.base_model_name_or_path = base_model
    return config


def export_adapter(backend: Any, out_dir: str | Path) -> Path:
    """Write ``backend``'s adapter as a peft adapter directory (``adapter_config.json``,
    ``adapter_model.safetensors``: what ``PeftModel.from_pretrained`` and
    ``model_args.adapter_name_or_path`` load) from rank 0, atomically (every rank calls it: the
    tensors are gathered). ``backend``: a rl-train backend with LoRA (``model_args.lora``)."""
    from safetensors.torch import save_file

    from rl_train import dist as rdist
    from rl_train.export import _finish, _fresh_tmp

    settings = backend.model_args.lora
    if settings is None or backend.role == "reference":
        raise ValueError(f"{backend.role}: no LoRA adapter to export (model_args.lora is unset)")
    out_dir = Path(out_dir)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in adapter_tensors(backend._iter_full_tensors()):
        if rdist.rank() == 0:
            tensors[name] = tensor.detach().to("cpu").contiguous().clone()
    if rdist.rank() == 0:
        tmp = _fresh_tmp(out_dir)
        peft_config(settings, backend.model_path, backend.role).save_pretrained(str(tmp))
        save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
        _finish(tmp, out_dir, None)
    rdist.barrier()
    return out_dir


def adapter_tensors(
    named: Iterator[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapter of a stream of HF-named full tensors, named as peft's
    ``adapter_model.safetensors`` names them (``base_model.model.<module>.lora_A.weight``)."""
    for name, tensor in named:
        if is_adapter_name(name):
            yield "base_model.model." + name.replace(f".{ADAPTER_NAME}.", "."), tensor
