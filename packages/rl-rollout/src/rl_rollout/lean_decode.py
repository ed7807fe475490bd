"""One decode step of a Llama-family model (Qwen2, Llama, Mistral) without transformers' forward.

A decode step feeds one token per running row. Through ``model(...)`` it costs 7 matrix products
and ~40 small ops per layer, each behind module calls, keyword plumbing and output dataclasses.
``LeanDecoder.step`` runs the same arithmetic with 4 matrix products per layer (q/k/v as one
product, gate/up as one) and no module calls:

    h = rms_norm(x);  q, k, v = split(h @ W_qkv + b_qkv);  rotary(q, k)
    K, V = cache.update(k, v);  x = x + sdpa(q, K, V, mask) @ W_o
    h = rms_norm(x);  g, u = split(h @ W_gate_up);  x = x + (silu(g) * u) @ W_down

The fused weights take no memory of their own: the model's ``q_proj``/``k_proj``/``v_proj``
(and ``gate_proj``/``up_proj``) weights and biases are re-pointed to row slices of one buffer,
so every writer of the model's parameters (``update_weights``' ``copy_``, ``load_state_dict``)
writes the fused buffer, and transformers' own forward (the engine's prefill) reads it. A
parameter replaced instead of written (``model.to(...)``, ``to_empty`` in sleep/wake) no longer
shares the buffer; ``step`` checks that and fuses again from the current values.

Measured (tools/bench/hf_decode.py, 2-core CPU, 64 rows x 128 tokens of a 4M-parameter Qwen2):
generation in 0.89x the time of transformers' forward. The step there is bound by its matrix
products (~50 GFLOP/s at 64 rows) and attention over the cache, not by Python.

CPU only (:func:`lean_decode_problem`): on CUDA and the NPU, sdpa's grouped-query path with a mask
falls back to the math kernel, and no accelerator has measured this step yet.

Numerics: the same operations in the same dtype as transformers (RMSNorm in float32, rotary with
the model's own rotary module, so every rope type is covered); a fused product can round
differently from three separate ones (float32: ~1e-6 relative). Models it does not cover
(:func:`lean_decode_problem` says why) keep transformers' forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["LeanDecoder", "lean_decode_problem"]

#: model types whose decoder layers have the layout this module reproduces
SUPPORTED_MODEL_TYPES = frozenset({"qwen2", "llama", "mistral"})
_LINEARS = {
    "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}


def lean_decode_problem(model: Any) -> str | None:
    """Why ``model`` (a transformers causal LM) cannot decode through :class:`LeanDecoder`, or
    None when it can: a device other than the CPU, the model type, the activation,
    sliding-window layers, per-head norms or a module layout this module does not reproduce."""
    config = model.config
    device = next(model.parameters()).device
    if device.type != "cpu":
        # sdpa's grouped-query path with a mask falls back to the math kernel on CUDA and the
        # NPU (see rl_rollout.gqa_attention), and this step was measured on the CPU only
        return f"device {device.type} (the lean step runs on the CPU)"
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} (supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))})"
    if getattr(config, "hidden_act", None) not in ("silu", "swish"):
        return f"hidden_act {getattr(config, 'hidden_act', None)!r} (supported: silu)"
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or (
        model_type == "mistral" and getattr(config, "sliding_window", None) is not None
    ):
        return "sliding-window attention layers"
    decoder = model.get_decoder()
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(decoder, name):
            return f"the decoder has no {name!r}"
    if getattr(model, "lm_head", None) is None:
        return "the model has no 'lm_head'"
    for index, layer in enumerate(decoder.layers):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        for owner_name, owner in (("self_attn", attn), ("mlp", mlp)):
            linears = _LINEARS[owner_name]
            if owner is None or any(
                not isinstance(getattr(owner, p, None), torch.nn.Linear) for p in linears
            ):
                return f"layer {index}: {owner_name} is not {'/'.join(linears)} linears"
        if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
            return f"layer {index}: per-head q/k norms"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            if not hasattr(getattr(layer, norm, None), "weight"):
                return f"layer {index}: no {norm}.weight"
        qkv_biases = [attn.q_proj.bias is None, attn.k_proj.bias is None, attn.v_proj.bias is None]
        up_biases = [mlp.gate_proj.bias is None, mlp.up_proj.bias is None]
        if len(set(qkv_biases)) > 1 or len(set(up_biases)) > 1:
            return f"layer {index}: some of the fused projections have a bias and some not"
    return None


@dataclass
class _Fused:
    """One decoder layer and its fused buffers (the module's q/k/v and gate/up parameters are
    views of their rows, see the module docstring)."""

    module: Any  # the decoder layer: norms, o_proj and down_proj are read through it
    qkv_weight: torch.Tensor  # [(Hq + 2 Hkv) D, hidden]
    qkv_bias: torch.Tensor | None
    gate_up_weight: torch.Tensor  # [2 I, hidden]
    gate_up_bias: torch.Tensor | None
    input_eps: float
    post_eps: float
    scaling: float


class LeanDecoder:
    """Decode steps of ``model`` (see module docstring). Build only where
    :func:`lean_decode_problem` is None."""

    def __init__(self, model: Any) -> None:
        problem = lean_decode_problem(model)
        if problem is not None:
            raise ValueError(f"LeanDecoder cannot run this model: {problem}")
        self.model = model
        self.decoder = model.get_decoder()
        config = model.config
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        first = self.decoder.layers[0].self_attn
        self.head_dim = int(first.q_proj.out_features // self.num_heads)
        self.layers: list[_Fused] = []
        # (module, attr, parameter, data_ptr) of every re-pointed parameter, checked each step
        self._watch: list[tuple[torch.nn.Module, str, torch.Tensor, int]] = []
        self.fusions = 0  # how often the weights were (re)fused: 1 unless parameters were replaced
        self._fuse()

    # ------------------------------------------------------------------ fused weights
    def _fuse(self) -> None:
        """Re-point each layer's q/k/v and gate/up parameters to row slices of one buffer
        holding their current values."""
        self.layers, self._watch = [], []
        for layer in self.decoder.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
            gate_up = [mlp.gate_proj, mlp.up_proj]
            qkv_weight = _share_one_buffer(qkv, "weight")
            gate_up_weight = _share_one_buffer(gate_up, "weight")
            assert qkv_weight is not None and gate_up_weight is not None
            self.layers.append(
                _Fused(
                    module=layer,
                    qkv_weight=qkv_weight,
                    qkv_bias=_share_one_buffer(qkv, "bias"),
                    gate_up_weight=gate_up_weight,
                    gate_up_bias=_share_one_buffer(gate_up, "bias"),
                    input_eps=_eps(layer.input_layernorm),
                    post_eps=_eps(layer.post_attention_layernorm),
                    scaling=float(getattr(attn, "scaling", self.head_dim**-0.5)),
                )
            )
            self._watch += [
                (linear, attr, param, param.data_ptr())
                for linear in qkv + gate_up
                for attr in ("weight", "bias")
                if (param := linear._parameters.get(attr)) is not None
            ]
        self.fusions += 1

    def _intact(self) -> bool:
        """Whether every re-pointed parameter is still the view made by `_fuse`: the same object
        at the same address (``model.to`` and ``to_empty`` swap a parameter's data, assignment
        swaps the object; writes in place, like ``update_weights``' ``copy_``, keep both)."""
        return all(
            linear._parameters.get(attr) is param and param.data_ptr() == ptr
            for linear, attr, param, ptr in self._watch
        )

    # ------------------------------------------------------------------ the step
    @torch.inference_mode()
    def step(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Any,
    ) -> torch.Tensor:
        """One decode step: ``input_ids [B]`` (each row's newest token), ``position_ids [B]``,
        ``attention_mask [B, L]`` bool (True = attend; ``L`` = the cache's columns after this
        step's) and ``cache`` (a transformers ``DynamicCache`` whose layers take ``update``).
        Appends each layer's new key/value column to ``cache``; returns the logits ``[B, V]``."""
        if not self._intact():
            self._fuse()
        batch = input_ids.shape[0]
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        x = self.decoder.embed_tokens(input_ids)  # [B, hidden]
        cos, sin = self.decoder.rotary_emb(x, position_ids.view(batch, 1))  # [B, 1, D]
        mask = attention_mask.view(batch, 1, 1, -1)
        for index, fused in enumerate(self.layers):
            layer = fused.module
            h = _rms_norm(x, layer.input_layernorm.weight, fused.input_eps)
            qkv = F.linear(h, fused.qkv_weight, fused.qkv_bias)  # [B, (Hq + 2 Hkv) D]
            qk = qkv[:, : (heads + kv_heads) * dim].view(batch, heads + kv_heads, dim)
            qk = qk * cos + _rotate_half(qk) * sin  # q and k heads rotated together
            query = qk[:, :heads].unsqueeze(2)  # [B, Hq, 1, D]
            key = qk[:, heads:].unsqueeze(2)  # [B, Hkv, 1, D]
            value = qkv[:, (heads + kv_heads) * dim :].view(batch, kv_heads, 1, dim)
            keys, values = cache.layers[index].update(key, value)  # [B, Hkv, L, D]
            attn = F.scaled_dot_product_attention(
                query,
                keys,
                values,
                attn_mask=mask,
                scale=fused.scaling,
                enable_gqa=heads != kv_heads,
            )  # [B, Hq, 1, D]
            o_proj = layer.self_attn.o_proj
            x = x + F.linear(attn.reshape(batch, heads * dim), o_proj.weight, o_proj.bias)
            h = _rms_norm(x, layer.post_attention_layernorm.weight, fused.post_eps)
            gate, up = F.linear(h, fused.gate_up_weight, fused.gate_up_bias).chunk(2, dim=-1)
            down = layer.mlp.down_proj
            x = x + F.linear(F.silu(gate) * up, down.weight, down.bias)
        x = _rms_norm(x, self.decoder.norm.weight, _eps(self.decoder.norm))
        head = self.model.lm_head
        return F.linear(x, head.weight, head.bias)


def _eps(norm: torch.nn.Module) -> float:
    eps = getattr(norm, "variance_epsilon", None)
    return float(eps if eps is not None else getattr(norm, "eps", 1e-6))


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama/Qwen2 RMSNorm: normalised in float32, cast back, then scaled."""
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _share_one_buffer(linears: list[torch.nn.Linear], attr: str) -> torch.Tensor | None:
    """Copy ``attr`` ("weight" or "bias") of ``linears`` into one buffer stacked along dim 0 and
    make each module's parameter a view of its rows; the buffer (or None without biases)."""
    params = [getattr(linear, attr) for linear in linears]
    if all(p is None for p in params):
        return None
    base = params[0]
    rows = [p.shape[0] for p in params]
    buffer = torch.empty((sum(rows), *base.shape[1:]), dtype=base.dtype, device=base.device)
    start = 0
    with torch.no_grad():
        for linear, param, count in zip(linears, params, rows):
            part = buffer[start : start + count]
            part.copy_(param)
            setattr(linear, attr, torch.nn.Parameter(part, requires_grad=param.requires_grad))
            start += count
    return buffer
