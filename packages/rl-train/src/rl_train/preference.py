"""Preference losses (DPO, IPO, cDPO, SimPO, ORPO, KTO) over a paired batch layout.

Paired layout: the rows of a batch interleave the two sides of each pair, row ``2i`` = chosen and
row ``2i+1`` = rejected of pair ``i``, so one forward of a micro-batch runs chosen and rejected
together (packed into one padding-free stream where the backend packs). Per-row tensors:
``input_ids``/``attention_mask``/``response_mask`` ``[2P, T]`` (prompt tokens are False in
``response_mask``: only response tokens count), ``pair_side`` ``[2P]`` (0 chosen, 1 rejected),
``pair_id`` ``[2P]`` and, for losses with a reference model, ``ref_logps`` ``[2P]`` (the
reference's summed response log-probs). Unpaired layout (KTO): one row per example with
``desirable`` ``[B]``, the reference point ``kl_reference`` ``[B]`` and ``desirable_total`` ``[B]``
(the mini-batch's number of desirable rows over all micro-batches and ranks, the denominator of
the desirable-row metrics; one value each, repeated).

Micro-batches must hold whole pairs (an even ``per_device_train_batch_size``, no shuffling or
token-budget batching): the loss checks ``pair_side``/``pair_id`` and raises otherwise. Losses are
per-pair means over the mini-batch's GLOBAL pair count (``LossContext.global_seqs / 2``), so
accumulation and data parallelism reproduce the single-process full-batch loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from rl_algos.losses import pair_accuracy, pair_ties
from rl_algos.preference import PreferenceInputs, get_preference_loss
from rl_train.types import Batch, ForwardOutput, LossContext, LossFn, LossResult


@dataclass(frozen=True)
class PreferenceLossConfig:
    """A preference loss from rl_algos' registry (``loss_type``) and its options."""

    loss_type: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    simpo_gamma: float = 0.5
    kto_desirable_weight: float = 1.0
    kto_undesirable_weight: float = 1.0

    def __post_init__(self) -> None:
        get_preference_loss(self.loss_type)  # unknown name -> the error lists the registry

    @property
    def needs_reference(self) -> bool:
        return get_preference_loss(self.loss_type).needs_reference

    @property
    def paired(self) -> bool:
        return get_preference_loss(self.loss_type).paired

    #: option name of rl_algos' preference losses -> the field (and config key) that sets it
    OPTION_FIELDS: ClassVar[dict[str, str]] = {
        "beta": "beta",
        "label_smoothing": "label_smoothing",
        "gamma": "simpo_gamma",
        "desirable_weight": "kto_desirable_weight",
        "undesirable_weight": "kto_undesirable_weight",
    }

    def options(self) -> dict[str, float]:
        """Keyword options of the chosen loss (those it declares)."""
        declared = get_preference_loss(self.loss_type).options
        return {k: getattr(self, self.OPTION_FIELDS[k]) for k in declared}

    def unread_fields(self) -> tuple[str, ...]:
        """The option fields the chosen loss does not read (e.g. label_smoothing with ipo)."""
        declared = get_preference_loss(self.loss_type).options
        return tuple(f for k, f in self.OPTION_FIELDS.items() if k not in declared)


def sequence_logps(log_probs: torch.Tensor, response_mask: torch.Tensor) -> tuple:
    """``(sum, mean)`` of per-token log-probs over the response: ``[B, T]`` -> ``[B]`` each."""
    mask = response_mask.to(log_probs.dtype)
    total = (log_probs * mask).sum(-1)
    return total, total / mask.sum(-1).clamp(min=1.0)


def preference_inputs(
    mb: Batch, sums: torch.Tensor, means: torch.Tensor, cfg: PreferenceLossConfig
) -> tuple[PreferenceInputs, int]:
    """The loss inputs of a micro-batch (paired or unpaired layout) and its number of examples."""
    ref = mb.get("ref_logps")
    if cfg.needs_reference and ref is None:
        raise KeyError(f"{cfg.loss_type} needs batch['ref_logps'] ([rows], summed log-probs)")
    if not cfg.paired:
        desirable = mb["desirable"].bool()
        kl = mb["kl_reference"][0] if "kl_reference" in mb else 0.0
        return PreferenceInputs(sums, means, ref_chosen_sum=ref, desirable=desirable, kl=kl), len(
            sums
        )
    check_pairs(mb)
    lengths = mb["response_mask"].sum(-1).clamp(min=1).to(sums.dtype)
    ref_mean = None if ref is None else ref / lengths
    return (
        PreferenceInputs(
            chosen_sum=sums[0::2],
            chosen_mean=means[0::2],
            rejected_sum=sums[1::2],
            rejected_mean=means[1::2],
            ref_chosen_sum=None if ref is None else ref[0::2],
            ref_rejected_sum=None if ref is None else ref[1::2],
            ref_chosen_mean=None if ref_mean is None else ref_mean[0::2],
            ref_rejected_mean=None if ref_mean is None else ref_mean[1::2],
        ),
        len(sums) // 2,
    )


def check_pairs(mb: Batch) -> None:
    """Raise unless rows alternate chosen/rejected of the same pair."""
    side, pid = mb["pair_side"], mb["pair_id"]
    n = int(side.shape[0])
    if (
        n % 2
        or bool((side[0::2] != 0).any())
        or bool((side[1::2] != 1).any())
        or bool((pid[0::2] != pid[1::2]).any())
    ):
        raise ValueError(
            "paired preference batch: rows must alternate chosen/rejected of one pair and a "
            "micro-batch must hold whole pairs (even per_device_train_batch_size, no shuffling, "
            "no token-budget batching)"
        )


def build_preference_loss(cfg: PreferenceLossConfig) -> LossFn:
    if not isinstance(cfg, PreferenceLossConfig):
        raise TypeError(f"build_preference_loss takes a PreferenceLossConfig, got {type(cfg)}")
    spec = get_preference_loss(cfg.loss_type)
    options = cfg.options()

    def loss_fn(mb: Batch, out: ForwardOutput, ctx: LossContext) -> LossResult:
        if out.log_probs is None:
            raise ValueError("preference loss needs log_probs in the forward output")
        sums, means = sequence_logps(out.log_probs, mb["response_mask"])
        x, _ = preference_inputs(mb, sums, means, cfg)
        result = spec(x, **options)
        n = max(ctx.global_seqs / (2.0 if spec.paired else 1.0), 1.0)
        loss = result.losses.sum() / n
        total = mb["desirable_total"][0] if "desirable_total" in mb else None
        return loss, preference_metrics(result, x, n, paired=spec.paired, desirable_total=total)

    return loss_fn


def preference_metrics(
    result,
    x: PreferenceInputs,
    n: float,
    *,
    paired: bool,
    desirable_total: float | torch.Tensor | None = None,
) -> dict:
    """Sums over the micro-batch divided by global counts (they add up to means):
    ``rewards/{chosen,rejected,margins,accuracies,ties}``, ``logps/{chosen,rejected}``.

    Paired: every count is ``n`` pairs. Unpaired (KTO): ``chosen`` averages the desirable rows
    over their global count ``desirable_total`` (without it: the micro-batch's share of ``n``),
    ``rejected`` the undesirable ones over ``n - desirable_total``; ``margins`` is the difference
    of the two means, ``accuracies`` the share of rows whose reward has the label's sign (a tie
    counts 0.5: :func:`rl_algos.losses.pair_accuracy`), ``ties`` the share of tied rows."""
    cr, rr = result.chosen_rewards.detach(), result.rejected_rewards.detach()
    logps = x.chosen_sum.detach()
    if paired:
        n_chosen = n_rejected = n
        rejected_logps = x.rejected_sum
    else:
        assert x.desirable is not None
        d = x.desirable.bool()
        if desirable_total is None:
            desirable_total = n * d.float().mean()
        n_chosen = max(float(desirable_total), 1.0)
        n_rejected = max(n - float(desirable_total), 1.0)
        rejected_logps = torch.where(d, torch.zeros_like(logps), logps)
        logps = torch.where(d, logps, torch.zeros_like(logps))
    chosen, rejected = cr.sum() / n_chosen, rr.sum() / n_rejected
    out = {
        "rewards/chosen": chosen,
        "rewards/rejected": rejected,
        "rewards/margins": chosen - rejected,
        "rewards/accuracies": pair_accuracy(cr, rr).sum() / n,
        "rewards/ties": pair_ties(cr, rr).sum() / n,
        "logps/chosen": logps.sum() / n_chosen,
    }
    if rejected_logps is not None:
        out["logps/rejected"] = rejected_logps.detach().sum() / n_rejected
    return out
