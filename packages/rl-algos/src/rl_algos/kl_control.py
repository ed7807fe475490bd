"""KL coefficient controllers (Ziegler et al. 2019, "Fine-Tuning LMs from Human Preferences",
arXiv:1909.08593) and the in-reward KL penalty."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rl_algos.losses import kl_penalty

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "apply_kl_penalty",
    "build_kl_controller",
]


@dataclass
class FixedKLController:
    """Constant coefficient: ``value`` never changes."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept for a common interface)."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


@dataclass
class AdaptiveKLController:
    """Adaptive coefficient (Ziegler et al. 2019, eq. 2):

    ``e = clip(KL / target - 1, -0.2, 0.2)``; ``beta <- beta * (1 + e * n_steps / horizon)``.
    """

    value: float
    target: float
    horizon: int

    def __post_init__(self) -> None:
        if self.target <= 0 or self.horizon <= 0:
            raise ValueError(
                f"target_kl and kl_horizon must be > 0, got {self.target}, {self.horizon}"
            )

    def update(self, current_kl: float, n_steps: int) -> None:
        """Update with the observed KL over ``n_steps`` samples/steps."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value, "target": self.target, "horizon": float(self.horizon)}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value, self.target, self.horizon = (
            float(state["value"]),
            float(state["target"]),
            int(state["horizon"]),
        )


def build_kl_controller(
    init_kl_coef: float, target_kl: float | None = None, kl_horizon: int = 10000
) -> FixedKLController | AdaptiveKLController:
    """ROLL names: ``init_kl_coef``, ``target_kl`` (None = fixed), ``kl_horizon``."""
    if target_kl is None:
        return FixedKLController(init_kl_coef)
    return AdaptiveKLController(init_kl_coef, target_kl, kl_horizon)


def apply_kl_penalty(
    token_level_scores: Tensor,
    log_probs: Tensor,
    ref_log_probs: Tensor,
    response_mask: Tensor,
    kl_coef: float,
    kind: str = "k1",
) -> tuple[Tensor, Tensor]:
    """Token-level rewards with the KL penalty folded in: ``r = score - beta * KL`` on the mask.

    Args:
        token_level_scores, log_probs, ref_log_probs, response_mask: ``[B, T]``.
    Returns:
        ``(token_level_rewards [B, T], kl [B, T])`` (kl masked, detached).
    """
    kl = kl_penalty(log_probs.detach(), ref_log_probs, kind) * response_mask
    return token_level_scores - kl_coef * kl, kl
