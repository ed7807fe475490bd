"""Log-probs straight from hidden states: an lm_head that never materialises ``[N, V]`` logits.

A causal LM's ``lm_head`` (``nn.Linear(H, V, bias=False)``) is replaced by :class:`LogProbHead`,
which holds the *same* weight parameter (tied embeddings stay tied, state-dict keys are unchanged,
FSDP2 / DeepSpeed wrap it like the linear it replaces). Without a request it returns plain logits
(generation, export, evaluation code see an ordinary model). Inside :func:`log_prob_request` it
returns ``[B, L, 2]`` (log-prob of the requested label, entropy) computed by
``rl_algos.logprobs.log_probs_from_hidden``: chunk by chunk in forward and backward, so the
bf16 logits (``N x V x 2`` bytes: 5 GB for 16k tokens at a 152k vocabulary), their float32 copies
and their gradient are never held. The computation runs inside the model's forward, where FSDP2 and
ZeRO have the weight gathered.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from rl_algos.logprobs import log_probs_from_hidden
from rl_train.args import LogprobSampling

__all__ = ["LogProbHead", "install_log_prob_head", "log_prob_head", "log_prob_request"]


@dataclass
class _Request:
    labels: torch.Tensor  # [B, L] int64, < 0 ignored
    sampling: LogprobSampling
    with_entropy: bool


class LogProbHead(nn.Module):
    """Drop-in for a bias-free ``lm_head``; see the module docstring."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        if linear.bias is not None:
            raise ValueError("LogProbHead replaces a bias-free lm_head only")
        self.weight = linear.weight  # the same Parameter (stays tied to the embedding)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._request: _Request | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [B, L, H]`` -> logits ``[B, L, V]``, or ``[B, L, 2]`` (log-prob, entropy;
        entropy 0 unless asked) inside :func:`log_prob_request`."""
        request = self._request
        if request is None:
            return nn.functional.linear(hidden, self.weight)
        if request.labels.shape != hidden.shape[:-1]:
            raise ValueError(
                f"log-prob labels {tuple(request.labels.shape)} do not match the hidden states "
                f"{tuple(hidden.shape[:-1])} (a model called with logits_to_keep?)"
            )
        log_probs, entropy = log_probs_from_hidden(
            hidden,
            self.weight,
            request.labels,
            temperature=request.sampling.temperature,
            top_k=request.sampling.top_k,
            top_p=request.sampling.top_p,
            with_entropy=request.with_entropy,
        )
        if entropy is None:
            entropy = torch.zeros_like(log_probs)
        return torch.stack([log_probs, entropy], dim=-1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias=False"


def install_log_prob_head(model: nn.Module) -> bool:
    """Replace ``model.lm_head`` by a :class:`LogProbHead` in place; False (model unchanged) when
    the model has no bias-free linear ``lm_head`` (e.g. the critic's value head)."""
    head = getattr(model, "lm_head", None)
    if isinstance(head, LogProbHead):
        return True
    if type(head) is not nn.Linear or head.bias is not None:
        return False
    model.lm_head = LogProbHead(head)
    return True


def log_prob_head(model: nn.Module) -> LogProbHead | None:
    """The installed head of a (possibly DeepSpeed-wrapped) model, or None."""
    inner = getattr(model, "module", model)
    head = getattr(inner, "lm_head", None)
    return head if isinstance(head, LogProbHead) else None


@contextmanager
def log_prob_request(
    head: LogProbHead, labels: torch.Tensor, *, sampling: LogprobSampling, with_entropy: bool
) -> Iterator[None]:
    """While open, ``head`` answers the next forward with log-probs of ``labels [B, L]`` under the
    ``sampling`` distribution."""
    head._request = _Request(labels, sampling, with_entropy)
    try:
        yield
    finally:
        head._request = None
