"""Choosing the attention kernel per device, and a varlen flash-attention kernel from PyTorch itself.

``resolve_attn_implementation(requested, device_kind)`` turns the config's ``attn_implementation``
(``auto``, ``fa2``/``flash_attention_2``, ``varlen``, ``sdpa``, ``eager``) into what this machine
can run, so one YAML runs on CUDA, NPU and CPU:

- ``auto``: ``rl_varlen`` on CUDA when PyTorch ships ``torch.nn.attention.varlen`` and the compute
  dtype is bf16/fp16 (flash kernels have no fp32), else ``sdpa``;
- ``flash_attention_2``: kept where the ``flash_attn`` package imports on CUDA; otherwise
  ``rl_varlen`` (CUDA) or ``sdpa``, with a warning naming the key;
- ``varlen``: ``rl_varlen``; an error off CUDA.

``rl_varlen`` is registered with transformers' ``AttentionInterface``. It runs PyTorch's built-in
flash-attention varlen kernel (``torch.nn.attention.varlen.varlen_attn``) on unpadded tokens:

- packed rows (``[1, N]`` with ``cu_seq_lens_q``/``max_length_q`` passed through the model call, as
  :func:`rl_train.modeling.token_outputs` does): one kernel call over all rows, no ``[N, N]`` mask;
- right-padded rows with a 2D ``attention_mask``: the padding is dropped before the kernel and the
  output scattered back (padding positions get 0);
- no mask: every row is a full causal sequence.

Without it, packed sequences under ``sdpa`` build a block-diagonal ``[N, N]`` mask and run the
masked (non-flash) kernel, and padded batches attend over padding.
"""

from __future__ import annotations

import importlib.util
import inspect
import warnings
from functools import cache
from typing import Any

import torch

VARLEN = "rl_varlen"
_NAMES = {
    "fa2": "flash_attention_2",
    "flash_attn": "flash_attention_2",
    "flash_attention_2": "flash_attention_2",
    "varlen": VARLEN,
    VARLEN: VARLEN,
    "sdpa": "sdpa",
    "eager": "eager",
    "auto": "auto",
}


@cache
def _varlen_fn() -> Any | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def varlen_available(device_kind: str) -> bool:
    """True where ``rl_varlen`` can run: CUDA with PyTorch's varlen flash attention."""
    return device_kind == "cuda" and _varlen_fn() is not None


def flash_attn_available(device_kind: str) -> bool:
    return device_kind == "cuda" and importlib.util.find_spec("flash_attn") is not None


def resolve_attn_implementation(
    requested: str | None,
    device_kind: str,
    compute_dtype: str = "bf16",
    *,
    key: str = "model_args.attn_implementation",
    flash_attn: bool | None = None,
) -> str:
    """The transformers ``attn_implementation`` to load with on ``device_kind`` for a model that
    computes in ``compute_dtype`` (``fp32``/``bf16``/``fp16``; see the module doc).

    Falls back with a ``UserWarning`` naming ``key`` when the requested kernel cannot run here.
    ``flash_attn``: whether the flash-attn package imports (None: look it up).
    """
    name = _NAMES.get(requested or "auto")
    if name is None:
        raise ValueError(f"{key}={requested!r}; expected one of {sorted(set(_NAMES))}")
    half = compute_dtype in ("bf16", "fp16")
    fallback = VARLEN if varlen_available(device_kind) and half else "sdpa"
    if name == "auto":
        return fallback
    if name == "flash_attention_2" and not half:
        warnings.warn(
            f"{key}={requested!r}: flash attention has no {compute_dtype} kernel; using sdpa",
            UserWarning,
            stacklevel=2,
        )
        return "sdpa"
    has_flash = flash_attn_available(device_kind) if flash_attn is None else flash_attn
    if name == "flash_attention_2" and not (device_kind == "cuda" and has_flash):
        warnings.warn(
            f"{key}={requested!r}: flash-attn is not available on {device_kind}; using {fallback}",
            UserWarning,
            stacklevel=2,
        )
        return fallback
    if name == VARLEN and not (varlen_available(device_kind) and half):
        raise ValueError(
            f"{key}={requested!r} needs CUDA, torch.nn.attention.varlen (PyTorch >= 2.10) and "
            f"bf16/fp16 compute; this is {device_kind}, {compute_dtype}, torch "
            f"{torch.__version__}: use auto or sdpa"
        )
    return name


def _causal_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int, scale: float
) -> torch.Tensor:
    """Causal attention of unpadded ``q [N, H, D]``, ``k/v [N, Hkv, D]`` over rows ``cu [R+1]``."""
    fn = _varlen_fn()
    assert fn is not None
    if k.shape[1] != q.shape[1]:  # grouped-query attention: share each KV head across its group
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    cu = cu.to(device=q.device, dtype=torch.int32)
    params = _varlen_params()
    causal: dict[str, Any] = (
        {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    )
    return fn(q, k, v, cu, cu, int(max_len), int(max_len), scale=scale, **causal)


@cache
def _varlen_params() -> frozenset[str]:
    fn = _varlen_fn()
    return frozenset() if fn is None else frozenset(inspect.signature(fn).parameters)


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: ``query [B, H, T, D]``, ``key/value [B, Hkv, T, D]`` ->
    ``([B, T, H, D], None)``. Causal; see the module docstring for the three input layouts."""
    if dropout:
        raise ValueError("rl_varlen attention does not implement dropout")
    b, h, t, d = query.shape
    scale = float(scaling if scaling is not None else d**-0.5)
    q = query.transpose(1, 2)  # [B, T, H, D]
    k = key.transpose(1, 2)
    v = value.transpose(1, 2)
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None:
        if b != 1:
            raise ValueError(f"packed rl_varlen attention expects one packed row, got {b}")
        out = _causal_varlen(q[0], k[0], v[0], cu, int(kwargs["max_length_q"]), scale)
        return out.unsqueeze(0), None
    if attention_mask is not None and attention_mask.dim() == 2 and not bool(attention_mask.all()):
        mask = attention_mask.to(torch.bool)
        lengths = mask.sum(-1, dtype=torch.int32)
        keep = mask.reshape(-1).nonzero().squeeze(-1)
        cu_rows = torch.zeros(b + 1, dtype=torch.int32, device=q.device)
        cu_rows[1:] = torch.cumsum(lengths, 0)
        flat = _causal_varlen(
            q.reshape(b * t, h, d)[keep],
            k.reshape(b * t, -1, d)[keep],
            v.reshape(b * t, -1, d)[keep],
            cu_rows,
            int(lengths.max()),
            scale,
        )
        out = flat.new_zeros(b * t, h, d).index_copy(0, keep, flat)
        return out.view(b, t, h, d), None
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            f"rl_varlen attention takes a 2D padding mask, got {tuple(attention_mask.shape)}"
        )
    cu_rows = torch.arange(0, (b + 1) * t, t, dtype=torch.int32, device=q.device)
    out = _causal_varlen(
        q.reshape(b * t, h, d), k.reshape(b * t, -1, d), v.reshape(b * t, -1, d), cu_rows, t, scale
    )
    return out.view(b, t, h, d), None


@cache
def register_varlen_attention() -> None:
    """Make ``attn_implementation="rl_varlen"`` loadable by transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(VARLEN, varlen_attention_forward)
    # like flash attention: no 4D mask; a 2D padding mask or None reaches the kernel
    AttentionMaskInterface.register(VARLEN, flash_attention_mask)


def packed_attention_kwargs(
    attn_implementation: str | None, cu_seqlens: torch.Tensor, lengths: torch.Tensor
) -> dict[str, Any]:
    """Extra model-call kwargs for a packed ``[1, N]`` forward: row boundaries for varlen kernels
    (``rl_varlen``, ``flash_attention_2``); nothing for kernels that derive them from positions."""
    if attn_implementation not in (VARLEN, "flash_attention_2"):
        return {}
    max_len = int(lengths.max()) if lengths.numel() else 0
    return {
        "cu_seq_lens_q": cu_seqlens,
        "cu_seq_lens_k": cu_seqlens,
        "max_length_q": max_len,
        "max_length_k": max_len,
    }


__all__ = [
    "VARLEN",
    "flash_attn_available",
    "packed_attention_kwargs",
    "register_varlen_attention",
    "resolve_attn_implementation",
    "varlen_attention_forward",
    "varlen_available",
]
