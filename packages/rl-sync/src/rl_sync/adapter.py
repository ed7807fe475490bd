"""Adapter-only weight payloads: a LoRA-trained policy's update as its low-rank factors.

A payload is ordinary named tensors (the same buckets, versions and checksums as a full sync):
for each adapted module ``<module>``, ``<module>.lora_A.weight`` ``[r, in]`` and
``<module>.lora_B.weight`` ``[out, r]`` with the scale ``alpha / r`` already multiplied into B.
A receiving engine keeps the base weight ``W0 [out, in]`` it loaded and installs
``W0 + B @ A`` (:func:`merge`) as ``<module>.weight``. The trainer's merged model uses the same
arithmetic, so both sides hold the same numbers. Bytes per update: ``r * (in + out)`` per module
instead of ``in * out``.
"""

from __future__ import annotations

import re

import torch

_NAME = re.compile(r"^(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")


def adapter_part(name: str) -> tuple[str, str] | None:
    """``(module, "A" | "B")`` of an adapter payload tensor's name, or None for another name."""
    match = _NAME.match(name)
    return None if match is None else (match["module"], match["part"])


def payload_names(module: str) -> tuple[str, str]:
    """The names of ``module``'s two factors in a payload."""
    return f"{module}.lora_A.weight", f"{module}.lora_B.weight"


def merge(base: torch.Tensor, a: torch.Tensor, b_scaled: torch.Tensor) -> torch.Tensor:
    """``base + b_scaled @ a`` computed in float32, returned in ``base``'s dtype and device:
    ``base [out, in]``, ``a [r, in]``, ``b_scaled [out, r]`` (shapes checked, naming them)."""
    out, inp = base.shape
    if (
        a.dim() != 2
        or b_scaled.dim() != 2
        or a.shape[1] != inp
        or b_scaled.shape != (out, a.shape[0])
    ):
        raise ValueError(
            f"adapter factors A {tuple(a.shape)} and B {tuple(b_scaled.shape)} do not fit a "
            f"weight of shape {tuple(base.shape)} (A [r, in], B [out, r])"
        )
    delta = b_scaled.to(base.device, torch.float32) @ a.to(base.device, torch.float32)
    return (base.float() + delta).to(base.dtype)
