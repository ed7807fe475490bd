"""Plain data types shared by every backend: batches, forward outputs, loss context."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Batch = dict[str, torch.Tensor]
"""A training batch: ``input_ids [B, T]``, ``attention_mask [B, T]`` and the per-token tensors of
the alignment convention (``response_mask``, ``old_log_probs``, ``advantages`` ...), all ``[B, T]``,
plus per-sample tensors ``[B]``. Right-padded."""


@dataclass
class ForwardOutput:
    """Per-token outputs of one forward pass, aligned with ``input_ids``.

    ``log_probs[b, t] = log p(input_ids[b, t] | input_ids[b, :t])``; column 0 is 0. ``values[b, t]``
    is the critic's value of the state before token t (``V(input_ids[b, :t])``); column 0 is 0.
    All tensors are ``[B, T]`` float32 (``None`` when not computed).
    """

    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None
    #: ``sum_v pi(v)^2`` of the log-probs' distribution at each token (column 0 is 0)
    sum_pi_squared: torch.Tensor | None = None
    #: ``[B, T, k]`` logits of each token's prediction at the ids a loss asked for (a
    #: teacher's top-k: rl_train.modeling.logits_at_outputs); training forwards only
    logits_at: torch.Tensor | None = None

    def detach_cpu(self) -> ForwardOutput:
        def _d(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.detach().float().cpu()

        return ForwardOutput(
            _d(self.log_probs), _d(self.entropy), _d(self.values), _d(self.sum_pi_squared)
        )


@dataclass(frozen=True)
class LossContext:
    """Normalisers of the current mini-batch, summed over micro-batches AND data-parallel ranks.

    A loss function divides its micro-batch sum by these global counts, so that summing micro-batch
    gradients over accumulation steps and ranks reproduces the full-batch loss of one process.

    Attributes:
        global_tokens: number of ``response_mask`` tokens in the mini-batch (all ranks).
        global_seqs: number of sequences in the mini-batch (all ranks).
        max_seq_len: the largest padded length ``T`` in the mini-batch: the denominator of
            ``seq-mean-token-sum-norm`` only where the loss config sets no ``norm_constant``
            (library use; it varies with prompt length and batch composition).
    """

    global_tokens: float
    global_seqs: float
    max_seq_len: int


LossResult = tuple[torch.Tensor, dict[str, torch.Tensor]]
"""A scalar loss (already normalised by the global counts) and detached metric tensors (sums over
the micro-batch's response tokens, divided by ``global_tokens``, so they add up like the loss)."""

LossFn = Callable[[Batch, ForwardOutput, LossContext], LossResult]
"""``loss_fn(micro_batch, forward_output, ctx) -> (loss, metrics)``."""
