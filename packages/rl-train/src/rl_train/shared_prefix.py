"""Log-probs of a micro-batch whose rows share prompts, running each distinct prompt once.

GRPO/RLVR samples every prompt G times, so a micro-batch holds G rows that start with the same
tokens. :func:`shared_prompt_log_probs` splits each row at its first response token ``r``:

* the *prefix* ``ids[:r-1]`` (the prompt less its last token) of each DISTINCT prefix (same length,
  same ids) is run once, right-padded to a common length ``P``, with grad; a cache records its
  per-layer keys/values;
* those keys/values are expanded to the rows (``index_select``: gradients of every row flow back
  into the one prefix forward);
* each row's remaining tokens ``ids[r-1:]`` (the last prompt token, the response and anything after
  it) run with the expanded cache, the concatenated attention mask and ``position_ids`` that
  continue from the row's prefix length; position ``j`` predicts token ``r + j``.

Log-probs (and entropy) come back ``[B, T]`` as :func:`rl_train.modeling.token_outputs` gives them,
on every column from the first response token on; the prompt's own columns are 0 (no loss reads
them). Prefixes are right-padded rather than left-padded so no query row is fully masked (a fully
masked softmax row gives NaN, whose backward would reach every key). The last prompt token runs
with its row because rows of one prompt predict different first response tokens: the prefix pass
needs no log-probs (it keeps one position's logits only).

Works with plain logits and with :class:`~rl_train.fused_head.LogProbHead`, under activation
checkpointing (the caches below stay correct when a checkpointed layer is replayed in backward),
FSDP2 (whose prefix pass is checkpointed when the layers are not: its parameters must be gathered
again for the prefix's gradients) and DeepSpeed (the model is called twice per micro-batch). Needs
a padded (not packed) batch, full attention and the ``sdpa`` or ``eager`` kernel
(:func:`check_shared_prompt`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicLayer

from rl_train.args import LogprobSampling

__all__ = [
    "SHARED_PROMPT_ATTENTION",
    "PrefixPlan",
    "check_shared_prompt",
    "plan_prefixes",
    "shared_prompt_log_probs",
]

KEY = "share_prompt_forward"
SHARED_PROMPT_ATTENTION = ("sdpa", "eager")
"""Attention kernels that take a padded ``[B, P + S]`` mask next to a cache (flash/varlen kernels
would need their own unpadding of cache and queries)."""


def check_shared_prompt(role: str, *, packed: bool, model: nn.Module) -> None:
    """Refuse ``share_prompt_forward`` where it cannot apply, naming the key and the reason."""
    if role == "critic":
        raise ValueError(f"{KEY}: the critic's value forward has no shared-prompt path")
    if packed:
        raise ValueError(
            f"{KEY} runs padded micro-batches; it cannot be combined with sequence packing "
            "(strategy_config.packed_forward / use_sequence_packing)"
        )
    inner = getattr(model, "module", model)  # a DeepSpeed engine wraps the HF model
    config = getattr(inner, "config", None)
    attn = getattr(config, "_attn_implementation", None)
    if attn not in SHARED_PROMPT_ATTENTION:
        raise ValueError(f"{KEY} needs attn_implementation sdpa or eager (the model runs {attn!r})")
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise ValueError(f"{KEY} needs full attention in every layer (model has {layer_types})")


@dataclass(frozen=True)
class PrefixPlan:
    """Which rows share which prefix.

    Attributes:
        prefix_lens: ``[B]`` tokens of each row run in the prefix pass (``ids[b, :prefix_lens[b]]``).
        first_rows: ``[U]`` one row holding each distinct prefix (the first one).
        row_prefix: ``[B]`` index into ``first_rows`` of each row's prefix.
    """

    prefix_lens: torch.Tensor
    first_rows: torch.Tensor
    row_prefix: torch.Tensor


def plan_prefixes(ids: torch.Tensor, mask: torch.Tensor, response_mask: torch.Tensor) -> PrefixPlan:
    """Split rows ``ids/mask/response_mask [B, T]`` (right-padded) at their first response token
    ``r``: the prefix is ``ids[:r-1]`` (a row without response tokens keeps its last token out of
    the prefix), and rows with equal prefixes (length and ids) share one entry."""
    lengths = mask.sum(dim=1)
    response = response_mask.bool() & mask.bool()
    has_response = response.any(dim=1)
    first = torch.where(has_response, response.int().argmax(dim=1), lengths)
    prefix_lens = (torch.minimum(first, lengths) - 1).clamp(min=0)
    seen: dict[tuple[int, ...], int] = {}
    first_rows: list[int] = []
    row_prefix: list[int] = []
    for b, n in enumerate(prefix_lens.tolist()):
        key = tuple(ids[b, :n].tolist())
        if key not in seen:
            seen[key] = len(first_rows)
            first_rows.append(b)
        row_prefix.append(seen[key])
    return PrefixPlan(
        prefix_lens=prefix_lens,
        first_rows=torch.tensor(first_rows, dtype=torch.long, device=ids.device),
        row_prefix=torch.tensor(row_prefix, dtype=torch.long, device=ids.device),
    )


def _lazy_init(layer: DynamicLayer, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
    """``DynamicLayer.lazy_initialization``: transformers 5 takes keys and values, 4.57 (the
    vllm-ascend 0.11 stack's) keys only."""
    if len(inspect.signature(DynamicLayer.lazy_initialization).parameters) > 2:
        layer.lazy_initialization(key_states, value_states)
    else:
        layer.lazy_initialization(key_states)


class _RecordLayer(DynamicLayer):
    """Keeps the keys/values of one forward (a replay under checkpointing overwrites them with
    equal values instead of appending)."""

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            _lazy_init(self, key_states, value_states)
        self.keys, self.values = key_states, value_states
        return key_states, value_states


class _PrefixLayer(DynamicLayer):
    """Fixed prefix keys/values ``[B, H_kv, P, D]`` placed before each call's own; never grows, so
    a replayed (checkpointed) layer sees the same states."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        _lazy_init(self, keys, values)
        self.keys, self.values = keys, values
        self.prefix = (keys, values)

    def update(self, key_states, value_states, *args, **kwargs):
        keys, values = self.prefix
        return torch.cat([keys, key_states], dim=-2), torch.cat([values, value_states], dim=-2)


def _require_cache_through_checkpointing(layers: list[nn.Module]) -> None:
    """transformers before 5 (4.57 is vllm-ascend 0.11's) drops the cache argument of every
    checkpointed decoder layer in training, with only a warning: the rows' pass would run without
    their prefix. Refused there, naming the way out."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    if layers and not hasattr(GradientCheckpointingLayer, "_can_checkpoint_with_cache"):
        import transformers

        raise RuntimeError(
            f"{KEY} with checkpointed decoder layers (gradient checkpointing, or FSDP2's prefix "
            f"pass) needs transformers >= 5: transformers {transformers.__version__} drops the "
            "prefix cache of a checkpointed layer in training; turn off gradient checkpointing "
            f"(model_args.disable_gradient_checkpointing) or {KEY}, or upgrade transformers"
        )


@contextmanager
def _prefix_checkpointed_under_fsdp2(model: nn.Module) -> Iterator[None]:
    """Checkpoint the prefix pass of FSDP2-sharded decoder layers that are not checkpointed.

    The prefix pass's keys/values reach the loss only through the row pass's attention, never
    through a layer's output, so FSDP2's pre-backward hook (on a layer's outputs) does not run for
    them: their gradients arrive after the row pass's backward of the same layer has resharded its
    parameters (the storage a linear's backward reads is gone). A checkpointed prefix pass is
    replayed through the layer's forward hooks in backward, which gather the parameters again (as
    with activation checkpointing on). Its cost: the prefixes' forward once more, in backward."""
    from functools import partial

    from torch.distributed.fsdp import FSDPModule
    from torch.utils.checkpoint import checkpoint
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [
        m
        for m in model.modules()
        if isinstance(m, GradientCheckpointingLayer)
        and isinstance(m, FSDPModule)
        and not m.gradient_checkpointing
    ]
    if not (layers and model.training and torch.is_grad_enabled()):
        yield
        return
    _require_cache_through_checkpointing(layers)
    # the prefix's _RecordLayer cache is replay-safe, so the cache argument may stay
    replay = {"gradient_checkpointing": True, "_can_checkpoint_with_cache": True,
              "_gradient_checkpointing_func": partial(checkpoint, use_reentrant=False)}  # fmt: skip
    saved = [{k: vars(layer)[k] for k in replay if k in vars(layer)} for layer in layers]
    for layer in layers:
        vars(layer).update(replay)
    try:
        yield
    finally:
        for layer, before in zip(layers, saved, strict=True):
            for name in replay:  # each back to what it was (an instance value or the class's)
                vars(layer).pop(name)
            vars(layer).update(before)


@contextmanager
def _cache_through_checkpointing(model: nn.Module) -> Iterator[None]:
    """Let checkpointed decoder layers keep the cache argument (HF drops it by default because
    its own caches would grow twice on the backward replay; the two above do not)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [
        m
        for m in model.modules()
        if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing
    ]
    if model.training and torch.is_grad_enabled():
        _require_cache_through_checkpointing(layers)
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache  # back to the class attribute


def _prefix_cache(
    model: nn.Module, ids: torch.Tensor, plan: PrefixPlan
) -> tuple[list[_PrefixLayer], torch.Tensor]:
    """Run each distinct prefix once; the per-row cache layers ``[B, H_kv, P, D]`` and the
    prefix mask ``[B, P]``."""
    lens = plan.prefix_lens[plan.first_rows]  # [U]
    p = int(lens.max().item())
    cols = torch.arange(p, device=ids.device)
    prefix_mask = (cols[None, :] < lens[:, None]).long()  # [U, P]
    prefix_ids = ids[plan.first_rows, :p] * prefix_mask
    cache = Cache(layer_class_to_replicate=_RecordLayer)
    with _prefix_checkpointed_under_fsdp2(model):
        model(
            input_ids=prefix_ids,
            attention_mask=prefix_mask,
            past_key_values=cache,
            use_cache=False,
            logits_to_keep=1,  # the prefix predicts nothing: skip the lm_head but one position
        )
    rows = plan.row_prefix
    layers = []
    for layer in cache.layers:
        assert isinstance(layer, _RecordLayer) and layer.keys is not None
        assert layer.values is not None
        layers.append(
            _PrefixLayer(layer.keys.index_select(0, rows), layer.values.index_select(0, rows))
        )
    return layers, prefix_mask.index_select(0, rows)


def shared_prompt_log_probs(
    model: nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    need_entropy: bool,
    sampling: LogprobSampling,
    need_sum_pi_squared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Log p(ids[b, t] | ids[b, :t]), entropy and (``need_sum_pi_squared``) ``sum_v pi(v)^2``,
    ``[B, T]`` each (the first two with grad), for right-padded ``ids/mask/response_mask
    [B, T]``; 0 on column 0, the prompt columns and padding. See the module docstring."""
    from rl_train.modeling import _log_probs_forward

    b, t = ids.shape
    plan = plan_prefixes(ids, mask, response_mask)
    lengths = mask.sum(dim=1)
    starts = plan.prefix_lens  # [B] first column of each row's own pass
    rest = lengths - starts  # [B] >= 1
    s = int(rest.max().item())
    j = torch.arange(s, device=ids.device)[None, :]
    cols = starts[:, None] + j  # [B, S] column of each own-pass token
    own_valid = j < rest[:, None]
    row_ids = ids.gather(1, cols.clamp(max=t - 1)) * own_valid
    label_valid = (j + 1) < rest[:, None]
    labels = torch.where(label_valid, ids.gather(1, (cols + 1).clamp(max=t - 1)), -1)
    with _cache_through_checkpointing(model):
        if int(starts.max().item()) > 0:
            layers, prefix_mask = _prefix_cache(model, ids, plan)
            cache: Cache | None = Cache(layers=list(layers))
            attention = torch.cat([prefix_mask, own_valid.long()], dim=1)
        else:  # no row has a prefix (one-token prompts): a plain forward of the rows
            cache, attention = None, own_valid.long()
        lp, ent, sps = _log_probs_forward(
            model,
            labels,
            need_entropy,
            sampling,
            need_sum_pi_squared,
            input_ids=row_ids,
            attention_mask=attention,
            position_ids=cols,
            past_key_values=cache,
        )

    # own position j predicts column starts + j + 1; invalid ones go to a dropped column T
    target = torch.where(label_valid, cols + 1, t)

    def place(x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(b, t + 1).scatter(1, target, x * label_valid)
        return out[:, :t]

    return (
        place(lp.float()),
        None if ent is None else place(ent.float()),
        None if sps is None else place(sps.float()),
    )
