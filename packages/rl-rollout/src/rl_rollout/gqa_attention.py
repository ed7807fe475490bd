"""sdpa without copying the KV cache for grouped-query attention under a padding mask (CPU).

transformers' ``sdpa`` attention calls ``repeat_kv`` (an ``expand`` + ``reshape`` that copies
every key and value of the cache, ``[B, Hkv, L, D] -> [B, H, L, D]``) whenever the model has fewer
KV heads than query heads AND an attention mask is passed, because CUDA's and the NPU's fused
kernels fall back to the slow math kernel with ``enable_gqa=True`` and a mask. The HF engine
always passes a mask (left-padded rows of different lengths), so on the CPU every decode step
copied the whole cache of every layer, twice: the copy grew with the sequence and took most of a
decode step (a Qwen2 model with 4 query and 2 KV heads, batch 64 at 160 tokens: 21 ms against
1 ms per layer call).

PyTorch's CPU kernels take ``enable_gqa=True`` with a mask, exactly. ``RL_GQA_SDPA``
(registered with transformers' ``AttentionInterface``) does that on the CPU and hands every other
case (no mask, no grouping, another device, position biases, paged caches) to transformers'
``sdpa`` unchanged, so it is safe to request on any device.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

RL_GQA_SDPA = "rl_gqa_sdpa"


def gqa_sdpa_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``query [B, H, q, D]``, ``key``/``value [B, Hkv, L, D]``,
    ``attention_mask`` a ``[B, 1, q, L]`` boolean (True = attend) or additive float mask; returns
    ``([B, q, H, D], None)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = getattr(module, "num_key_value_groups", 1) > 1
    if (
        not grouped
        or attention_mask is None
        or query.device.type != "cpu"
        or kwargs.get("position_bias") is not None
        or kwargs.get("cache") is not None
        or kwargs.get("output_attentions", False)
    ):
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    # with a mask transformers' sdpa never sets is_causal: the mask carries causality
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=False,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


@cache
def register_gqa_sdpa() -> str:
    """Register ``RL_GQA_SDPA`` with transformers (once per process); its name."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(RL_GQA_SDPA, gqa_sdpa_attention_forward)
    AttentionMaskInterface.register(RL_GQA_SDPA, sdpa_mask)  # the masks sdpa gets
    return RL_GQA_SDPA


def engine_attn_implementation(requested: str | None) -> str:
    """What the HF engine loads a model with: ``sdpa`` (the default) becomes ``RL_GQA_SDPA``
    (identical outputs, no KV copy under GQA on the CPU); any other choice is kept."""
    name = requested or "sdpa"
    return register_gqa_sdpa() if name == "sdpa" else name
