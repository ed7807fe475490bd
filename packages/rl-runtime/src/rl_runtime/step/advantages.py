"""The advantage block of the step loop: the runtime chooses and passes, rl_algos computes.

`AdvantageConfig` (built by rl_runtime.compose) says how; `compute_advantages(batch, cfg, ...)`
takes a collated batch's episode rewards, mask, normalisation groups (`group_keys`: `traj_group_id`
| `tags` | `batch`; compose resolves ROLL's aliases) and, for a step-wise estimator, its per-turn
rows (`step_rows`), and calls `rl_algos.estimate.estimate_advantages` once: reward normalisation,
reward clip, reward KL penalty, the estimator by name, whitening, advantage clip. The reward KL
controller (rl_algos.kl_control) lives with the run: `reward_kl_coef` reads it each step,
`update_kl_controller` feeds it the step's KL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from rl_algos.estimate import estimator_needs
from rl_runtime.step.collate import CollatedBatch

GROUPINGS = ("traj_group_id", "tags", "batch")
METHODS = ("mean_std", "mean", "asym_clip", "identity")
NEEDS = ("values", "baseline_scores", "step_rows", "sum_pi_squared")


@dataclass(frozen=True)
class KLControlConfig:
    """Reward KL penalty: `in_reward` (ROLL's add_token_level_kl), the controller's start value
    `init_coef`, `target` (adaptive controller when set, else fixed) and `horizon`."""

    in_reward: bool = False
    init_coef: float = 0.0
    target: float | None = None
    horizon: int = 10000

    def build(self):
        """A fresh rl_algos KL controller (Fixed or Adaptive); state lives with the run."""
        from rl_algos.kl_control import build_kl_controller

        return build_kl_controller(self.init_coef, self.target, self.horizon)


def restore_kl_controller(controller, saved: Mapping[str, float]) -> None:
    """Continue a checkpointed run's reward KL control in `controller`, built from this run's
    config: an adaptive controller resumed from an adaptive one takes the coefficient it had
    evolved to (its only state); the rest (target and horizon, a fixed coefficient, a controller
    of the other kind) stays the config's, as `rl_runtime.run.resume_guard`'s warnings say.
    `saved`: the checkpointed controller's `state_dict()`."""
    from rl_algos.kl_control import AdaptiveKLController

    if isinstance(controller, AdaptiveKLController) and "target" in saved:
        controller.value = float(saved["value"])


def reward_kl_coef(cfg: KLControlConfig, controller) -> float:
    """The coefficient of the reward KL penalty this step (0 when it is off)."""
    return float(controller.value) if cfg.in_reward else 0.0


def update_kl_controller(controller, out: dict[str, torch.Tensor], mask: torch.Tensor) -> dict:
    """Feed the step's mean per-sequence reward KL to the controller (ROLL: n_steps = batch
    size); returns `train/reward_kl` and the new `train/kl_coef`. No-op without a KL term."""
    if "kl" not in out:
        return {}
    m = mask.to(torch.float32)
    kl = float(((out["kl"] * m).sum(-1) / m.sum(-1).clamp(min=1)).mean())
    controller.update(kl, n_steps=int(mask.shape[0]))
    return {"train/reward_kl": kl, "train/kl_coef": float(controller.value)}


@dataclass(frozen=True)
class AdvantageConfig:
    """How advantages are computed (built by rl_runtime.compose from the experiment config).

    `kl_kind`: the reward KL estimator (rl_algos.losses.kl_penalty names); the coefficient itself
    comes from the KL controller at each step. `reward_clip`: clamp the normalised rewards to
    `[-reward_clip, reward_clip]` where `rl_algos.estimate.reward_clip_site` says (None: no clamp). `gigpo_*`:
    GiGPO's episode/step weights and the discount across turns (step_reward_gamma) of the
    step-wise estimators (gigpo, step_reinforce; the latter discounts within a turn by `gamma`).
    `needs` is derived from the estimator's signature (rl_algos.estimate.estimator_needs)."""

    adv_estimator: str = "grpo"
    grouping: str = "traj_group_id"
    method: str = "mean_std"
    gamma: float = 1.0
    lam: float = 1.0
    whiten_advantages: bool = False
    advantage_clip: float | None = None
    reward_clip: float | None = None
    kl_kind: str = "k1"
    gigpo_episode_weight: float = 1.0
    gigpo_step_weight: float = 1.0
    gigpo_gamma: float = 0.95

    def __post_init__(self) -> None:
        try:
            estimator_needs(self.adv_estimator)
        except KeyError as exc:
            raise ValueError(f"adv_estimator={self.adv_estimator!r}: {exc.args[0]}") from None
        for value, allowed, name in (
            (self.grouping, GROUPINGS, "reward_normalization.grouping"),
            (self.method, METHODS, "reward_normalization.method"),
        ):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not supported; choose from {allowed}")
        if self.reward_clip is not None and not self.reward_clip > 0:
            raise ValueError(f"reward_clip={self.reward_clip!r} must be > 0 (or null: no clip)")
        from rl_config.schema.algorithm import STD_FREE_ESTIMATORS, STD_SCALING_METHODS

        if self.adv_estimator in STD_FREE_ESTIMATORS and self.method in STD_SCALING_METHODS:
            raise ValueError(
                f"reward_normalization.method={self.method!r} divides by the group std, which "
                f"adv_estimator={self.adv_estimator!r} is defined without: use 'identity'"
            )

    @property
    def needs(self) -> frozenset[str]:
        return estimator_needs(self.adv_estimator)


def group_keys(batch: CollatedBatch, grouping: str) -> torch.Tensor:
    """Dense group id per row `[B]` for the reward-normalisation grouping."""
    if grouping == "traj_group_id":
        return batch.tensors["group_index"].clone()
    if grouping == "tags":
        dense: dict[str, int] = {}
        return torch.tensor([dense.setdefault(t, len(dense)) for t in batch.tags])
    if grouping == "batch":
        return torch.zeros(batch.batch_size, dtype=torch.long)
    raise ValueError(f"reward_normalization.grouping={grouping!r}; choose from {GROUPINGS}")


def step_rows(batch: CollatedBatch) -> dict[str, torch.Tensor]:
    """The batch's step rows, one per (trajectory, turn) with model tokens
    (rl_algos.estimate.step_rows: `row_of`, `step_ids`, `step_rewards`, `anchor_ids`, `step_mask`)."""
    from rl_algos.estimate import step_rows as build_step_rows

    t = batch.tensors
    return build_step_rows(
        t["response_mask"], t["turn_index"], t["rewards"], t["input_ids"], batch.turn_spans
    )


def compute_advantages(
    batch: CollatedBatch,
    cfg: AdvantageConfig,
    *,
    values: torch.Tensor | None = None,
    log_probs: torch.Tensor | None = None,
    ref_log_probs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    baseline_scores: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Advantages and returns `[B, T]` (zero outside `response_mask`) plus the normalised
    `scores [B]` the estimator took, with `kl_coef > 0` the per-token reward `kl [B, T]` and,
    with `cfg.reward_clip`, the fraction of rewards it clamped `reward_clip_frac` (a scalar: of
    the scores, the rows, or the step rows, where `rl_algos.estimate.reward_clip_site` puts the clamp).

    `values [B, T]`: critic values (estimators that need them); `baseline_scores [B]`: the
    episode rewards of greedy rollouts of the same envs (remax), normalised (and clamped) like
    the scores. `sum_pi_squared [B, T]`: with `log_probs`, the actor's statistics the optimal
    token baseline reads."""
    from rl_algos.estimate import estimate_advantages

    t = batch.tensors
    return estimate_advantages(
        t["episode_rewards"],
        t["response_mask"],
        group_keys(batch, cfg.grouping),
        cfg.adv_estimator,
        method=cfg.method,
        gamma=cfg.gamma,
        lam=cfg.lam,
        reward_clip=cfg.reward_clip,
        whiten=cfg.whiten_advantages,
        advantage_clip=cfg.advantage_clip,
        kl_coef=kl_coef,
        kl_kind=cfg.kl_kind,
        log_probs=log_probs,
        ref_log_probs=ref_log_probs,
        values=values,
        baseline_scores=baseline_scores,
        steps=step_rows(batch) if "step_rows" in cfg.needs else None,
        sum_pi_squared=sum_pi_squared,
        step_gamma=cfg.gigpo_gamma,
        step_weight=cfg.gigpo_step_weight,
        episode_weight=cfg.gigpo_episode_weight,
    )
