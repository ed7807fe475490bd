"""Preference losses by name, behind one signature.

Every loss takes the same sequence-level inputs (``PreferenceInputs``: summed and length-averaged
policy log-probs of chosen/rejected, reference sums where the loss needs them) and its own keyword
options, and returns a ``PreferenceLossOutput``. A spec says what the loss needs, so callers never
test a name: ``needs_reference`` (a frozen reference model), ``paired`` (chosen and rejected of one
prompt; False: KTO's unpaired rows with a ``desirable`` label and a reference point ``kl``).

    spec = get_preference_loss("sigmoid")
    out = spec(inputs, beta=0.1, label_smoothing=0.0)

Names: sigmoid (DPO; cDPO with ``label_smoothing``), ipo, simpo, kto, orpo. A duplicate name is an
error; ``KeyError`` lists the known names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from rl_algos.losses import PreferenceLossOutput, dpo, ipo, kto, orpo, simpo

__all__ = [
    "PreferenceInputs",
    "PreferenceLossSpec",
    "get_preference_loss",
    "list_preference_losses",
    "register_preference_loss",
]


@dataclass(frozen=True)
class PreferenceInputs:
    """Sequence log-probs, all ``[B]`` (B pairs; for unpaired losses B rows held in ``chosen_*``).

    ``*_sum``: summed over response tokens; ``*_mean``: divided by the response length.
    ``ref_*`` are None for reference-free losses; ``ref_*_mean`` only IPO reads. ``desirable`` ``[B]`` bool and the scalar ``kl``
    reference point are KTO's.
    """

    chosen_sum: Tensor
    chosen_mean: Tensor
    rejected_sum: Tensor | None = None
    rejected_mean: Tensor | None = None
    ref_chosen_sum: Tensor | None = None
    ref_rejected_sum: Tensor | None = None
    ref_chosen_mean: Tensor | None = None
    ref_rejected_mean: Tensor | None = None
    desirable: Tensor | None = None
    kl: Tensor | float = 0.0


@dataclass(frozen=True)
class PreferenceLossSpec:
    name: str
    fn: Callable[..., PreferenceLossOutput]
    needs_reference: bool
    paired: bool
    options: tuple[str, ...]

    def __call__(self, x: PreferenceInputs, **options: float) -> PreferenceLossOutput:
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise TypeError(f"{self.name}: unknown option(s) {unknown}; known: {self.options}")
        if self.needs_reference and x.ref_chosen_sum is None:
            raise ValueError(f"{self.name} needs reference log-probs (ref_chosen_sum)")
        return self.fn(x, **options)


_REGISTRY: dict[str, PreferenceLossSpec] = {}


def register_preference_loss(
    name: str, *, needs_reference: bool, paired: bool = True, options: tuple[str, ...] = ()
) -> Callable[[Callable[..., PreferenceLossOutput]], Callable[..., PreferenceLossOutput]]:
    """Decorator registering ``fn(inputs, **options)`` under ``name``; a duplicate name raises."""

    def deco(fn: Callable[..., PreferenceLossOutput]) -> Callable[..., PreferenceLossOutput]:
        if name in _REGISTRY:
            raise ValueError(f"preference loss {name!r} is already registered")
        _REGISTRY[name] = PreferenceLossSpec(name, fn, needs_reference, paired, options)
        return fn

    return deco


def get_preference_loss(name: str) -> PreferenceLossSpec:
    if name not in _REGISTRY:
        raise KeyError(f"unknown preference loss {name!r}; known: {list_preference_losses()}")
    return _REGISTRY[name]


def list_preference_losses() -> list[str]:
    return sorted(_REGISTRY)


def _rejected(x: PreferenceInputs) -> tuple[Tensor, Tensor]:
    if x.rejected_sum is None or x.rejected_mean is None:
        raise ValueError("a paired preference loss needs rejected log-probs")
    return x.rejected_sum, x.rejected_mean


@register_preference_loss("sigmoid", needs_reference=True, options=("beta", "label_smoothing"))
def _sigmoid(x: PreferenceInputs, beta: float = 0.1, label_smoothing: float = 0.0):
    rej, _ = _rejected(x)
    assert x.ref_chosen_sum is not None and x.ref_rejected_sum is not None
    return dpo(
        x.chosen_sum, rej, x.ref_chosen_sum, x.ref_rejected_sum, beta=beta,
        label_smoothing=label_smoothing,
    )  # fmt: skip


@register_preference_loss("ipo", needs_reference=True, options=("beta",))
def _ipo(x: PreferenceInputs, beta: float = 0.1):
    """On length-averaged log-probs, as the paper (and TRL) define it."""
    _, rej = _rejected(x)
    if x.ref_chosen_mean is None or x.ref_rejected_mean is None:
        raise ValueError("ipo needs length-averaged reference log-probs (ref_*_mean)")
    return ipo(x.chosen_mean, rej, x.ref_chosen_mean, x.ref_rejected_mean, beta=beta)


@register_preference_loss(
    "simpo", needs_reference=False, options=("beta", "gamma", "label_smoothing")
)
def _simpo(x: PreferenceInputs, beta: float = 2.0, gamma: float = 0.5, label_smoothing=0.0):
    _, rej = _rejected(x)
    return simpo(x.chosen_mean, rej, beta=beta, gamma=gamma, label_smoothing=label_smoothing)


@register_preference_loss("orpo", needs_reference=False, options=("beta",))
def _orpo(x: PreferenceInputs, beta: float = 0.1):
    _, rej = _rejected(x)
    return orpo(x.chosen_mean, rej, beta=beta)


@register_preference_loss(
    "kto",
    needs_reference=True,
    paired=False,
    options=("beta", "desirable_weight", "undesirable_weight"),
)
def _kto(
    x: PreferenceInputs,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
):
    if x.desirable is None:
        raise ValueError("kto needs a desirable label per row")
    assert x.ref_chosen_sum is not None
    return kto(
        x.chosen_sum, x.ref_chosen_sum, x.desirable, x.kl, beta=beta,
        desirable_weight=desirable_weight, undesirable_weight=undesirable_weight,
    )  # fmt: skip
