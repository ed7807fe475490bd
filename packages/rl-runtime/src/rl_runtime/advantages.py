"""The advantage block of the step loop: reward normalisation, estimator, whitening, clipping.

Composes rl_algos (no math of its own beyond building group keys and step rows):

1. scores `[B]` = episode rewards (format penalties included by the envs).
2. `reward_normalization`: `grouping` (`traj_group_id` | `tags` | `batch`) picks the groups,
   `method` (`mean_std` | `asym_clip` | `identity`) the normalisation (rl_algos.rewards).
3. `adv_estimator`:
   - `grpo` / `reinforce` (trajectory-wise, StarPO): the normalised score on every model token.
   - `gae`: the normalised score on the last model token (minus the KL penalty per token when
     `kl_coef > 0`), GAE with the critic's `values` (rl_algos.advantages.gae).
   - `gigpo` (step-wise): each turn is a step row; episode-level groups are the env groups and
     step-level groups are equal observations (anchor states) inside them
     (rl_algos.advantages.gigpo); the step advantages are written back onto each turn's tokens.
4. `whiten_advantages` (rl_algos.aggregate.masked_whiten), `advantage_clip`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rl_runtime.collate import CollatedBatch

ESTIMATORS = ("grpo", "gae", "reinforce", "gigpo")
GROUPINGS = ("traj_group_id", "tags", "batch")
METHODS = ("mean_std", "asym_clip", "identity")


@dataclass(frozen=True)
class AdvantageConfig:
    adv_estimator: str = "grpo"
    grouping: str = "traj_group_id"
    method: str = "mean_std"
    gamma: float = 1.0
    lam: float = 1.0
    whiten_advantages: bool = False
    advantage_clip: float | None = None
    kl_coef: float = 0.0
    gigpo_step_weight: float = 1.0
    gigpo_gamma: float = 0.95

    def __post_init__(self) -> None:
        for value, allowed, name in (
            (self.adv_estimator, ESTIMATORS, "adv_estimator"),
            (self.grouping, GROUPINGS, "reward_normalization.grouping"),
            (self.method, METHODS, "reward_normalization.method"),
        ):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not supported; choose from {allowed}")


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


def _broadcast(per_row: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return per_row.unsqueeze(-1).to(torch.float32) * mask.to(torch.float32)


def _last_token_rewards(per_row: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`[B, T]` with each row's score on its last model token."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=1).values
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
        raise ValueError("gigpo: the batch has no model turns")
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
) -> dict[str, torch.Tensor]:
    """Advantages and returns `[B, T]` (zero outside `response_mask`) plus the normalised
    `scores [B]` and, with `kl_coef > 0`, the per-token `kl [B, T]` used in the reward."""
    from rl_algos import advantages as est
    from rl_algos.aggregate import masked_whiten

    t = batch.tensors
    mask = t["response_mask"]
    raw = t["episode_rewards"].to(torch.float32)
    scores = normalize_scores(raw, group_keys(batch, cfg.grouping), cfg.method)
    out: dict[str, torch.Tensor] = {"scores": scores}
    kl = None
    if cfg.kl_coef > 0:
        if log_probs is None or ref_log_probs is None:
            raise ValueError("kl_coef > 0 needs log_probs and ref_log_probs")
        kl = (log_probs - ref_log_probs) * mask
        out["kl"] = kl
    if cfg.adv_estimator in ("grpo", "reinforce"):
        token_rewards = _last_token_rewards(scores, mask)
        if kl is not None:
            token_rewards = token_rewards - cfg.kl_coef * kl
        adv, ret = est.reinforce_returns(token_rewards, mask, gamma=cfg.gamma)
    elif cfg.adv_estimator == "gae":
        if values is None:
            raise ValueError("adv_estimator=gae needs critic values (configure a critic)")
        token_rewards = _last_token_rewards(scores, mask)
        if kl is not None:
            token_rewards = token_rewards - cfg.kl_coef * kl
        adv, ret = est.gae(token_rewards, values.to(torch.float32), mask, cfg.gamma, cfg.lam)
    else:  # gigpo
        rows = step_rows(batch)
        row_of = rows["row_of"]
        step_adv, _ = est.gigpo(
            raw[row_of],
            rows["step_mask"],
            t["group_index"][row_of],
            traj_ids=row_of,
            step_ids=rows["step_ids"],
            step_rewards=rows["step_rewards"],
            anchor_ids=rows["anchor_ids"],
            gamma=cfg.gigpo_gamma,
            step_weight=cfg.gigpo_step_weight,
        )
        adv = torch.zeros(mask.shape, dtype=torch.float32).index_add_(0, row_of, step_adv.float())
        ret = adv
    adv = adv.to(torch.float32)
    if cfg.whiten_advantages:
        adv = masked_whiten(adv, mask)
    if cfg.advantage_clip is not None and cfg.advantage_clip > 0:
        adv = adv.clamp(-cfg.advantage_clip, cfg.advantage_clip)
    adv = adv * mask
    out["advantages"] = adv
    out["returns"] = ret.to(torch.float32) * mask
    return out


def group_success_stats(batch: CollatedBatch, keys: Sequence[str]) -> dict[str, float]:
    """Mean success and reward per key (e.g. tags)."""
    t = batch.tensors
    out: dict[str, float] = {}
    for key in dict.fromkeys(keys):
        idx = [i for i, k in enumerate(keys) if k == key]
        out[f"{key}/success_rate"] = float(t["success"][idx].mean())
        out[f"{key}/episode_reward"] = float(t["episode_rewards"][idx].mean())
    return out
