"""The advantage block of the step loop: reward normalisation, KL penalty, estimator, whitening.

Composes rl_algos (no estimator math of its own):

1. scores `[B]` = episode rewards (format penalties included by the envs).
2. `reward_normalization`: `grouping` (`traj_group_id` | `tags` | `batch`; compose resolves ROLL's
   aliases) picks the groups, `method` (`mean_std` | `mean` | `asym_clip` | `identity`) the
   normalisation
   (rl_algos.rewards).
   `reward_clip` (ROLL's key) clamps the normalised rewards to `[-reward_clip, reward_clip]`
   (`reward_clip_site`): the scores the estimator takes, or, for an estimator that divides by a
   group std itself (grpo, grpo_passk) and for the step-wise ones (gigpo, step_reinforce), the
   per-row value it returns, since re-scaling the clamped scores would undo the clamp there.
3. With a reward KL penalty (`kl_coef > 0`, ROLL's `add_token_level_kl`), the scores go on each
   row's last model token and `kl_coef * KL(kind)` is subtracted per token (rl_algos.kl_control).
4. The estimator, by name from rl_algos' registry (`get_estimator`); its signature declares what it
   needs (`EstimatorSpec.needs`): critic `values` (gae), greedy `baseline_scores` (remax), per-turn
   step rows (`step_rewards`: gigpo, step_reinforce); group estimators get the normalisation
   groups as `index`.
5. `whiten_advantages` (rl_algos.aggregate.masked_whiten), `advantage_clip`.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from rl_runtime.step.collate import CollatedBatch

GROUPINGS = ("traj_group_id", "tags", "batch")
METHODS = ("mean_std", "mean", "asym_clip", "identity")
NEEDS = ("values", "baseline_scores", "step_rows")


def estimator_needs(name: str) -> frozenset[str]:
    """What the registered estimator `name` needs beyond scores, mask and groups, read from its
    signature: `values` (a critic), `baseline_scores` (greedy rollouts), `step_rows` (per-turn
    rows). An unknown name raises rl_algos' KeyError listing the registry."""
    from rl_algos.advantages import get_estimator

    params = inspect.signature(get_estimator(name)).parameters
    needs = set()
    if "values" in params:
        needs.add("values")
    if "baseline_scores" in params:
        needs.add("baseline_scores")
    if "step_rewards" in params:
        needs.add("step_rows")
    return frozenset(needs)


def reward_clip_site(name: str) -> str:
    """Where `reward_clip` acts for the registered estimator `name`, read from its signature:
    `"scores"`, the normalised scores it takes (ROLL's place: after reward normalisation, before
    the estimator), or `"advantages"`, each row's value it returns, for an estimator that would
    undo a clamp of its input: one that divides its input by a group std (a `norm_by_std`
    parameter that defaults to True: grpo, grpo_passk; a group's z-scores do not change when its
    extreme values are clamped) and the step-wise ones (gigpo, step_reinforce), whose per-step
    value is what ROLL clamps. For grpo after `mean_std` normalisation that value is the
    normalised reward itself (its z-score of z-scores is the identity up to epsilon), so the
    result is ROLL's: normalise, clamp, then the reward on every model token."""
    from rl_algos.advantages import get_estimator

    params = inspect.signature(get_estimator(name)).parameters
    by_std = "norm_by_std" in params and params["norm_by_std"].default is True
    return "advantages" if by_std or "step_rows" in estimator_needs(name) else "scores"


def clip_row_values(
    advantages: torch.Tensor, mask: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clamp each row's value to `[-clip, clip]`, rows `[R, T]` being one value times a fixed
    token pattern (an outcome on every model token, or its reward-to-go): the value is the one on
    the row's last model token, and a clamped row is scaled with it. Returns the rows `[R, T]`
    (bit-identical where the value is within the clip; exactly `+-clip` on a constant row that
    is clamped) and which rows were clamped `[R]` bool."""
    from rl_algos.rewards import clip_rewards

    last = _last_positions(mask)
    value = advantages.gather(1, last.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    value = torch.where(last >= 0, value, torch.zeros_like(value))
    clipped = clip_rewards(value, clip)
    hit = clipped != value
    pattern = advantages / torch.where(hit, value, torch.ones_like(value)).unsqueeze(-1)
    rows = torch.where(hit.unsqueeze(-1), clipped.unsqueeze(-1) * pattern, advantages)
    return rows, hit


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
    `[-reward_clip, reward_clip]` where `reward_clip_site` says (None: no clamp). `gigpo_*`:
    GiGPO's episode/step weights and the discount across turns (step_reward_gamma) of the
    step-wise estimators (gigpo, step_reinforce; the latter discounts within a turn by `gamma`).
    `needs` is derived from the estimator's signature."""

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


def normalize_scores(scores: torch.Tensor, keys: torch.Tensor, method: str) -> torch.Tensor:
    """Normalise `[B]` scores within the groups `keys` by `method` (rl_algos.rewards)."""
    from rl_algos.rewards import normalize_rewards

    return normalize_rewards(scores, grouping="group", index=keys, method=method)


def _last_positions(mask: torch.Tensor) -> torch.Tensor:
    """Each row's last model token `[B]` of `mask [B, T]`, -1 for a row without one."""
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    return torch.where(mask, positions, -1).max(dim=1).values


def _last_token_rewards(per_row: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`[B, T]` with each row's score on its last model token."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    last = _last_positions(mask)
    rows = (last >= 0).nonzero().flatten()
    out[rows, last[rows]] = per_row[rows].to(torch.float32)
    return out


def step_rows(batch: CollatedBatch) -> dict[str, torch.Tensor]:
    """One row per (trajectory, turn) with model tokens: `row_of [S]`, `step_ids [S]`,
    `step_rewards [S]`, `anchor_ids [S]` (hash of the tokens the model saw just before the turn:
    the observation), `step_mask [S, T]` (the turn's model tokens)."""
    t = batch.tensors
    mask, turn_index, rewards, ids = (
        t["response_mask"],
        t["turn_index"],
        t["rewards"],
        t["input_ids"],
    )
    row_of, steps, step_rewards, anchors, masks = [], [], [], [], []
    anchor_dense: dict[bytes, int] = {}
    for b, spans in enumerate(batch.turn_spans):
        prev_end = 0
        for k, (start, end) in enumerate(spans):
            step_mask = mask[b] & (turn_index[b] >= 0)
            step_mask = step_mask & (torch.arange(mask.shape[1]) >= start)
            step_mask = step_mask & (torch.arange(mask.shape[1]) < end)
            if not bool(step_mask.any()):
                prev_end = end
                continue
            context = ids[b, prev_end:start].numpy().tobytes()
            digest = hashlib.blake2b(context, digest_size=8).digest()
            row_of.append(b)
            steps.append(k)
            step_rewards.append(float(rewards[b, start:end].sum()))
            anchors.append(anchor_dense.setdefault(digest, len(anchor_dense)))
            masks.append(step_mask)
            prev_end = end
    if not masks:
        raise ValueError("step-wise advantages: the batch has no model turns")
    return {
        "row_of": torch.tensor(row_of),
        "step_ids": torch.tensor(steps),
        "step_rewards": torch.tensor(step_rewards),
        "anchor_ids": torch.tensor(anchors),
        "step_mask": torch.stack(masks),
    }


def compute_advantages(
    batch: CollatedBatch,
    cfg: AdvantageConfig,
    *,
    values: torch.Tensor | None = None,
    log_probs: torch.Tensor | None = None,
    ref_log_probs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    baseline_scores: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Advantages and returns `[B, T]` (zero outside `response_mask`) plus the normalised
    `scores [B]` the estimator took, with `kl_coef > 0` the per-token reward `kl [B, T]` and,
    with `cfg.reward_clip`, the fraction of rewards it clamped `reward_clip_frac` (a scalar: of
    the scores, the rows, or the step rows, where `reward_clip_site` puts the clamp).

    `values [B, T]`: critic values (estimators that need them); `baseline_scores [B]`: the
    episode rewards of greedy rollouts of the same envs (remax), normalised (and clamped) like
    the scores."""
    from rl_algos.advantages import get_estimator
    from rl_algos.aggregate import masked_whiten
    from rl_algos.kl_control import apply_kl_penalty
    from rl_algos.rewards import clip_rewards

    t = batch.tensors
    mask = t["response_mask"]
    raw = t["episode_rewards"].to(torch.float32)
    keys = group_keys(batch, cfg.grouping)
    scores = normalize_scores(raw, keys, cfg.method)
    out: dict[str, torch.Tensor] = {}
    clip = cfg.reward_clip
    clip_scores = clip is not None and reward_clip_site(cfg.adv_estimator) == "scores"
    if clip_scores:
        clipped = clip_rewards(scores, clip)
        out["reward_clip_frac"] = (clipped != scores).to(torch.float32).mean()
        scores = clipped
    out["scores"] = scores
    fn, needs = get_estimator(cfg.adv_estimator), cfg.needs
    params = inspect.signature(fn).parameters
    rewards: torch.Tensor = scores
    if kl_coef > 0 or "values" in needs:
        rewards = _last_token_rewards(scores, mask)
    if kl_coef > 0:
        if log_probs is None or ref_log_probs is None:
            raise ValueError("a reward KL penalty needs log_probs and ref_log_probs")
        rewards, kl = apply_kl_penalty(
            rewards, log_probs, ref_log_probs, mask.to(torch.float32), kl_coef, cfg.kl_kind
        )
        out["kl"] = kl
    kwargs: dict[str, object] = {}
    if "gamma" in params:
        kwargs["gamma"] = cfg.gigpo_gamma if "step_rows" in needs else cfg.gamma
    if "values" in needs:
        if values is None:
            raise ValueError(
                f"adv_estimator={cfg.adv_estimator} needs critic values (configure a critic)"
            )
        adv, ret = fn(rewards, values.to(torch.float32), mask, lam=cfg.lam, **kwargs)
    elif "step_rows" in needs:
        adv, ret, hit = _step_estimate(batch, cfg, fn, scores, keys, kwargs)
        if hit is not None:
            out["reward_clip_frac"] = hit.to(torch.float32).mean()
    else:
        if "baseline_scores" in needs:
            if baseline_scores is None:
                raise ValueError(
                    f"adv_estimator={cfg.adv_estimator} needs baseline_scores (greedy rollouts)"
                )
            baseline = normalize_scores(baseline_scores.to(torch.float32), keys, cfg.method)
            kwargs["baseline_scores"] = clip_rewards(baseline, clip) if clip_scores else baseline
        adv, ret = fn(rewards, mask, keys, **kwargs)
        if clip is not None and not clip_scores:  # the estimator's per-row value is clamped
            clipped_adv, hit = clip_row_values(adv.to(torch.float32), mask, clip)
            out["reward_clip_frac"] = hit.to(torch.float32).mean()
            adv, ret = clipped_adv, (clipped_adv if ret is adv else ret)
    adv = adv.to(torch.float32)
    if cfg.whiten_advantages:
        adv = masked_whiten(adv, mask)
    if cfg.advantage_clip is not None and cfg.advantage_clip > 0:
        adv = adv.clamp(-cfg.advantage_clip, cfg.advantage_clip)
    adv = adv * mask
    out["advantages"] = adv
    out["returns"] = ret.to(torch.float32) * mask
    return out


def _step_estimate(
    batch: CollatedBatch,
    cfg: AdvantageConfig,
    fn,
    scores: torch.Tensor,
    keys: torch.Tensor,
    kwargs: dict[str, object],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A step-wise estimator (gigpo, step_reinforce): one row per model turn, written back onto
    its tokens. The estimator gets those of the step inputs its signature names; with
    `cfg.reward_clip` each step's value is clamped (ROLL clamps the normalised step reward), and
    which step rows were clamped `[S]` comes back third (None without a clip)."""
    mask = batch.tensors["response_mask"]
    rows = step_rows(batch)
    row_of = rows["row_of"]
    offered = {
        "traj_ids": row_of,
        "step_ids": rows["step_ids"],
        "step_rewards": rows["step_rewards"],
        "anchor_ids": rows["anchor_ids"],
        "step_weight": cfg.gigpo_step_weight,
        "episode_weight": cfg.gigpo_episode_weight,
        "token_gamma": cfg.gamma,
        "method": cfg.method,
    }
    params = inspect.signature(fn).parameters
    step_kwargs = {k: v for k, v in offered.items() if k in params}
    step_adv, _ = fn(scores[row_of], rows["step_mask"], keys[row_of], **step_kwargs, **kwargs)
    step_adv, hit = step_adv.float(), None
    if cfg.reward_clip is not None:
        step_adv, hit = clip_row_values(step_adv, rows["step_mask"], cfg.reward_clip)
    adv = torch.zeros(mask.shape, dtype=torch.float32).index_add_(0, row_of, step_adv)
    return adv, adv, hit
