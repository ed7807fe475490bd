"""Loading HF models per role and computing aligned per-token outputs from a forward pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from rl_algos.logprobs import log_probs_from_logits_chunked, sum_pi_squared_from_logits
from rl_train.args import LogprobSampling, ModelArgs
from rl_train.attention import (
    VARLEN,
    packed_attention_kwargs,
    register_varlen_attention,
    resolve_attn_implementation,
)
from rl_train.batching import pack, trim_padding, unpack
from rl_train.fused_head import install_log_prob_head, log_prob_head, log_prob_request
from rl_train.shared_prefix import shared_prompt_log_probs
from rl_train.types import Batch, ForwardOutput

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ROLES = ("actor", "critic", "reference")


def check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"role={role!r}; expected one of {ROLES}")
    return role


def load_model(
    model_path: str | Path,
    role: str,
    model_args: ModelArgs,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    device_kind: str = "cpu",
    fused_lm_head: bool = False,
) -> nn.Module:
    """``Qwen2ForCausalLM``-style LM for actor/reference; the same backbone with a 1-unit token
    classification head (``score``, the value head) for the critic. Loaded on CPU in ``dtype``;
    the value head is initialised from ``seed`` so every rank builds the same critic. The attention
    kernel is ``model_args.attn_implementation`` resolved for ``device_kind`` and the compute
    dtype ``model_args.dtype`` (FSDP2 loads fp32 master weights that compute in bf16).
    ``fused_lm_head``: actor/reference get a :class:`~rl_train.fused_head.LogProbHead` (log-probs
    from hidden states, no ``[N, V]`` logits; see :func:`resolve_fused_lm_head`).
    ``model_args.lora`` (actor/critic): LoRA adapters on the frozen model (:mod:`rl_train.lora`).
    ``model_args.config_overrides``: HF config attributes set before the weights load
    (:func:`rl_config.model_config.apply_model_config_overrides`)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    from rl_config.model_config import apply_model_config_overrides

    check_role(role)
    attn = resolve_attn_implementation(
        model_args.attn_implementation, device_kind, model_args.dtype
    )
    if attn == VARLEN:
        register_varlen_attention()
    kwargs: dict = {"dtype": dtype, "trust_remote_code": False, "attn_implementation": attn}
    torch.manual_seed(seed)
    overrides = model_args.config_overrides
    if role == "critic":
        config = AutoConfig.from_pretrained(str(model_path), num_labels=1, trust_remote_code=False)
        apply_model_config_overrides(config, overrides)
        config.classifier_dropout = 0.0
        model = AutoModelForTokenClassification.from_pretrained(
            str(model_path), config=config, **kwargs
        )
    else:
        if overrides:
            config = AutoConfig.from_pretrained(str(model_path), trust_remote_code=False)
            kwargs["config"] = apply_model_config_overrides(config, overrides)
        model = AutoModelForCausalLM.from_pretrained(str(model_path), **kwargs)
        if fused_lm_head:
            install_log_prob_head(model)
    model.config.use_cache = False
    if role != "reference" and model_args.freeze_module_prefix:
        freeze_parameters(model, model_args.freeze_module_prefix)
    if role != "reference" and model_args.lora is not None:
        from rl_train.lora import apply_lora

        model = apply_lora(model, model_args.lora, role)
    return model


def _bool_option(name: str, value: object, default: bool) -> bool:
    """A true/false ``strategy_config`` option; unset gives ``default``."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"strategy_config.{name} must be true or false, got {value!r}")
    return value


def resolve_fused_lm_head(value: object, device_kind: str) -> bool:
    """The ``fused_lm_head`` strategy option: unset = on for accelerators (where the ``[N, V]``
    logits dominate memory and time), off on the CPU; true/false force it."""
    return _bool_option("fused_lm_head", value, device_kind != "cpu")


def freeze_parameters(model: nn.Module, prefixes: tuple[str, ...]) -> list[str]:
    """``requires_grad=False`` on every parameter whose name starts with one of ``prefixes``
    (before any wrapping, so FSDP2/DeepSpeed see it and the optimizer leaves them out); returns
    the frozen names. A prefix that matches no parameter is a ValueError naming the key."""
    names = [name for name, _ in model.named_parameters()]
    unmatched = [p for p in prefixes if not any(n.startswith(p) for n in names)]
    if unmatched:
        tops = sorted({n.split(".")[0] + "." + n.split(".")[1] for n in names if "." in n})
        raise ValueError(
            f"model_args.freeze_module_prefix: {unmatched} match no parameter of "
            f"{type(model).__name__} (its parameters start with {tops[:8]})"
        )
    frozen = []
    for name, param in model.named_parameters():
        if name.startswith(prefixes):
            param.requires_grad_(False)
            frozen.append(name)
    if len(frozen) == len(names):
        raise ValueError(
            f"model_args.freeze_module_prefix={list(prefixes)} freezes every parameter: "
            "nothing would be trained"
        )
    return frozen


def attn_implementation(model: nn.Module) -> str | None:
    """The attention kernel a loaded (possibly wrapped) HF model runs."""
    inner = getattr(model, "module", model)  # a DeepSpeed engine wraps the HF model
    config = getattr(inner, "config", None)
    return getattr(config, "_attn_implementation", None)


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Non-reentrant activation checkpointing of every decoder layer (works under FSDP2/ZeRO)."""
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if enable is None:
        raise TypeError(f"{type(model).__name__} does not support gradient checkpointing")
    enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of an HF model (its ``_no_split_modules`` classes)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__}: cannot find decoder layers (_no_split_modules)")
    return layers


def compile_decoder_layers(model: nn.Module) -> int:
    """``torch.compile`` each decoder layer's ``forward`` (fuses norms, rotary embedding and the
    gated activation into few kernels; shapes dynamic for packed streams). Only ``forward`` is
    replaced, so module hooks (FSDP2, ZeRO, activation checkpointing) stay outside the compiled
    code and parameter names are unchanged. Returns the number of layers compiled."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.forward = torch.compile(layer.forward, dynamic=True)  # type: ignore[method-assign]
    return len(layers)


def resolve_compile_layers(value: object) -> bool:
    """The ``compile_layers`` strategy option (default off: compiling costs start-up time)."""
    return _bool_option("compile_layers", value, False)


def _shift_right(x: torch.Tensor) -> torch.Tensor:
    """``[B, T-1]`` predictions for tokens 1..T-1 -> ``[B, T]`` aligned with the tokens (col 0 = 0)."""
    return torch.cat([x.new_zeros(x.shape[0], 1), x], dim=1)


def _log_probs_forward(
    model: nn.Module,
    labels: torch.Tensor,
    need_entropy: bool,
    sampling: LogprobSampling,
    need_sum_pi_squared: bool = False,
    **inputs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Forward ``inputs`` and return log p(labels), entropy and (``need_sum_pi_squared``)
    ``sum_v pi(v)^2`` of the ``sampling`` distribution, ``[B, L]`` each, for the ``[B, L]``
    positions of the forward (labels < 0 give 0). With a :class:`LogProbHead` installed the head
    computes the first two from hidden states; otherwise from the ``[B, L, V]`` logits, chunked
    (a truncated distribution is sorted chunk by chunk too)."""
    head = log_prob_head(model)
    if need_sum_pi_squared:
        if head is not None:
            raise ValueError(
                "sum_pi_squared needs the logits: set actor_train.strategy_args.strategy_config."
                "fused_lm_head: false"
            )
        if sampling.top_k is not None or sampling.top_p is not None:
            raise ValueError(
                "sum_pi_squared of a top-k/top-p truncated distribution is not implemented"
            )
    if head is not None:
        with log_prob_request(head, labels, sampling=sampling, with_entropy=need_entropy):
            out = model(use_cache=False, **inputs).logits  # [B, L, 2]
        return out[..., 0], (out[..., 1] if need_entropy else None), None
    logits = model(use_cache=False, **inputs).logits
    lp, ent = log_probs_from_logits_chunked(
        logits,
        labels,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        with_entropy=need_entropy,
    )
    sps = None
    if need_sum_pi_squared:
        sps = sum_pi_squared_from_logits(logits, temperature=sampling.temperature)
        sps = torch.where(labels >= 0, sps, torch.zeros_like(sps))
    return lp, ent, sps


def token_outputs(
    model: nn.Module,
    batch: Batch,
    *,
    role: str,
    packed: bool = False,
    need_entropy: bool = False,
    sampling: LogprobSampling | None = None,
    share_prompt: bool = False,
    need_sum_pi_squared: bool = False,
) -> ForwardOutput:
    """Forward ``batch`` through ``model`` and return aligned ``[B, T]`` outputs (with grad).

    Actor/reference give ``log_probs`` (and ``entropy``); the critic gives ``values``. Padding
    columns (``attention_mask == 0``) are 0. With ``packed=True`` the padding is removed and rows are
    concatenated into one ``[1, N]`` stream whose ``position_ids`` restart per row (HF attention
    then masks across rows: varlen kernels with flash-attention, a block mask with sdpa/eager).
    With ``share_prompt=True`` (actor/reference, padded) each distinct prompt of the batch runs
    once (:mod:`rl_train.shared_prefix`); the prompt columns of the log-probs are then 0.
    Log-probs and entropy are those of the ``sampling`` distribution (None: the raw model).
    ``need_sum_pi_squared`` (actor, no grad): also ``sum_pi_squared`` of that distribution.
    """
    sampling = LogprobSampling() if sampling is None else sampling
    if share_prompt and packed:
        raise ValueError("share_prompt_forward cannot be combined with sequence packing")
    sps_out: torch.Tensor | None = None
    trimmed, ids, mask, full_t = _trimmed_inputs(batch)
    b, t = ids.shape
    if packed:
        packed_ids, position_ids, layout = pack(ids, mask)
        inputs = dict(
            input_ids=packed_ids,
            position_ids=position_ids,
            **packed_attention_kwargs(
                attn_implementation(model), layout.cu_seqlens, layout.lengths
            ),
        )
        starts = layout.cu_seqlens[:-1].long()
        if role == "critic":
            v = model(use_cache=False, **inputs).logits[..., 0].float().reshape(-1)  # [N]
            shifted = torch.cat([v.new_zeros(1), v[:-1]])
            shifted = shifted.index_fill(0, starts, 0.0)
            result = ForwardOutput(values=unpack(shifted, layout))
        else:
            # the last position predicts nothing: an ignored label (its output is dropped below)
            labels = torch.cat([packed_ids[:, 1:], packed_ids.new_full((1, 1), -1)], dim=1)
            lp, ent, sps = _log_probs_forward(
                model, labels, need_entropy, sampling, need_sum_pi_squared, **inputs
            )

            def aligned(x: torch.Tensor | None) -> torch.Tensor | None:
                if x is None:
                    return None
                x = torch.cat([x.new_zeros(1), x.reshape(-1)[:-1]]).index_fill(0, starts, 0.0)
                return unpack(x, layout)

            result = ForwardOutput(log_probs=aligned(lp), entropy=aligned(ent))
            sps_out = aligned(sps)
    elif share_prompt:
        if role == "critic":
            raise ValueError("share_prompt_forward: the critic's value forward has no shared path")
        if "response_mask" not in trimmed:
            raise ValueError("share_prompt_forward needs the batch's response_mask")
        lp, ent, sps_out = shared_prompt_log_probs(
            model,
            ids,
            mask,
            trimmed["response_mask"],
            need_entropy=need_entropy,
            sampling=sampling,
            need_sum_pi_squared=need_sum_pi_squared,
        )
        result = ForwardOutput(log_probs=lp, entropy=ent)
    else:
        valid = mask.to(torch.float32)
        if role == "critic":
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            values = _shift_right(logits[:, :-1, 0].float()) * valid
            result = ForwardOutput(values=values)
        else:
            labels = torch.cat([ids[:, 1:], ids.new_full((b, 1), -1)], dim=1)
            lp, ent, sps = _log_probs_forward(
                model,
                labels,
                need_entropy,
                sampling,
                need_sum_pi_squared,
                input_ids=ids,
                attention_mask=mask,
            )
            lp, ent = lp[:, :-1], (None if ent is None else ent[:, :-1])
            result = ForwardOutput(
                log_probs=_shift_right(lp) * valid,
                entropy=None if ent is None else _shift_right(ent) * valid,
            )
            sps_out = None if sps is None else _shift_right(sps[:, :-1]) * valid
    result = ForwardOutput(result.log_probs, result.entropy, result.values, sps_out)
    if t < full_t:
        result = ForwardOutput(
            *(
                None if x is None else nn.functional.pad(x, (0, full_t - t))
                for x in (result.log_probs, result.entropy, result.values, result.sum_pi_squared)
            )
        )
    return result


def _trimmed_inputs(batch: Batch) -> tuple[Batch, torch.Tensor, torch.Tensor, int]:
    """``(batch without its all-padding columns, its input_ids [B, t], attention mask [B, t]
    (ones when the batch has none), the full width T)``."""
    full_t = int(batch["input_ids"].shape[1])
    trimmed = trim_padding(batch)
    ids = trimmed["input_ids"]
    mask = trimmed.get("attention_mask")
    if mask is None:
        mask = torch.ones_like(ids)
    return trimmed, ids, mask, full_t


def _padded_logits(model: nn.Module, batch: Batch) -> tuple[Batch, torch.Tensor, int]:
    """``(trimmed batch, logits [B, t, V] of the padded forward, full width T)``: the forward
    of the distribution-level paths below. They run padded whatever ``use_sequence_packing``
    and ``share_prompt_forward`` say (both only change how the same numbers are computed), and
    call the model without a log-prob request, so a fused lm_head answers plain logits."""
    trimmed, ids, mask, full_t = _trimmed_inputs(batch)
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    return trimmed, logits, full_t


def _aligned3(x: torch.Tensor, valid: torch.Tensor, full_t: int) -> torch.Tensor:
    """``[B, t-1, k]`` predictions for tokens 1..t-1 -> ``[B, T, k]`` aligned with the tokens
    (column 0, padding columns and the trimmed tail 0)."""
    x = torch.cat([x.new_zeros(x.shape[0], 1, x.shape[2]), x], dim=1) * valid[..., None]
    return nn.functional.pad(x, (0, 0, 0, full_t - x.shape[1]))


@torch.no_grad()
def teacher_topk_outputs(
    model: nn.Module, batch: Batch, *, k: int, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A teacher's next-token distribution at every position of ``batch``, restricted to its
    ``k`` most likely tokens (k = 0: the whole vocabulary; rl_algos.distill.teacher_topk):
    ``(log_probs [B, T, k], token ids [B, T, k])``, float32 and int64 on CPU, aligned with
    ``input_ids`` like ``log_probs`` (column t: the distribution of token t given the tokens
    before it; column 0 and padding: 0)."""
    from rl_algos.distill import teacher_topk

    trimmed, logits, full_t = _padded_logits(model, batch)
    lp, ids = teacher_topk(logits[:, :-1], k, temperature)
    valid = trimmed.get("attention_mask", torch.ones_like(trimmed["input_ids"])).to(lp.device)
    lp = _aligned3(lp.float(), valid.float(), full_t)
    ids = _aligned3(ids, valid.long(), full_t)
    return lp.cpu(), ids.cpu()


def logits_at_outputs(model: nn.Module, batch: Batch, ids_key: str) -> ForwardOutput:
    """With grad: ``log_probs [B, T]`` of the tokens (the raw model's distribution) and
    ``logits_at [B, T, k]``, the logits of the next-token prediction at each position gathered
    at ``batch[ids_key] [B, T, k]`` (a teacher's top-k ids, aligned like
    :func:`teacher_topk_outputs`; column 0 and padding 0)."""
    if ids_key not in batch:
        raise KeyError(f"the loss reads the logits at batch[{ids_key!r}] ([B, T, k] token ids)")
    trimmed, logits, full_t = _padded_logits(model, batch)
    ids = trimmed["input_ids"]
    b = ids.shape[0]
    valid = trimmed.get("attention_mask", torch.ones_like(ids)).to(logits.device)
    labels = torch.cat([ids[:, 1:], ids.new_full((b, 1), -1)], dim=1)
    lp, _ = log_probs_from_logits_chunked(logits, labels)
    lp = nn.functional.pad(_shift_right(lp[:, :-1]) * valid, (0, full_t - ids.shape[1]))
    index = trimmed[ids_key][:, 1:].long().to(logits.device)
    at = logits[:, :-1].float().gather(-1, index)
    return ForwardOutput(log_probs=lp, logits_at=_aligned3(at, valid.float(), full_t))
