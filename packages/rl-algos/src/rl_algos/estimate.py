"""Advantages of a batch in one call: reward normalisation, reward clip, reward KL penalty, the
estimator by name, whitening and the advantage clip (`estimate_advantages`).

Shapes: ``B`` rows (samples), ``T`` tokens, ``S`` step rows (one per model turn of a row).

1. ``scores [B]`` = episode rewards normalised within the groups ``group_ids [B]`` by ``method``
   (`rl_algos.rewards.normalize_rewards`: ``mean_std`` | ``mean`` | ``asym_clip`` | ``identity``).
2. ``reward_clip`` clamps the normalised rewards to ``[-reward_clip, reward_clip]`` where
   `reward_clip_site` says: the scores the estimator takes, or, for an estimator that divides by
   a group std itself (grpo, grpo_passk) and for the step-wise ones (gigpo, step_reinforce), the
   per-row value it returns, since re-scaling the clamped scores would undo the clamp there.
3. With a reward KL penalty (``kl_coef > 0``), the scores go on each row's last model token and
   ``kl_coef * KL(kl_kind)`` is subtracted per token (`rl_algos.kl_control.apply_kl_penalty`).
4. The estimator, by name from the registry (`rl_algos.advantages.get_estimator`); its signature
   says what it needs (`estimator_needs`): critic ``values`` (gae), greedy ``baseline_scores``
   (remax), per-turn step rows (`step_rows`: gigpo, step_reinforce), the old policy's
   ``log_probs`` and ``sum_pi_squared`` (optimal_token_baseline); group estimators get
   ``group_ids`` as their ``index``.
5. Whitening (`rl_algos.aggregate.masked_whiten`), then ``advantage_clip``; zero outside the mask.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from rl_algos.advantages import get_estimator
from rl_algos.aggregate import masked_whiten
from rl_algos.kl_control import apply_kl_penalty
from rl_algos.rewards import clip_rewards, normalize_rewards


def estimator_needs(name: str) -> frozenset[str]:
    """What the registered estimator `name` needs beyond scores, mask and groups, read from its
    signature: ``values`` (a critic), ``baseline_scores`` (greedy rollouts), ``step_rows``
    (per-turn rows), ``sum_pi_squared`` (the old policy's ``log_probs`` and ``sum_v pi(v)^2``
    per token: optimal_token_baseline). An unknown name raises the registry's KeyError listing
    the names."""
    params = inspect.signature(get_estimator(name)).parameters
    needs = set()
    if "values" in params:
        needs.add("values")
    if "baseline_scores" in params:
        needs.add("baseline_scores")
    if "step_rewards" in params:
        needs.add("step_rows")
    if "sum_pi_squared" in params:
        needs.add("sum_pi_squared")
    return frozenset(needs)


def reward_clip_site(name: str) -> str:
    """Where ``reward_clip`` acts for the registered estimator `name`, read from its signature:
    ``"scores"``, the normalised scores it takes (ROLL's place: after reward normalisation, before
    the estimator), or ``"advantages"``, each row's value it returns, for an estimator that would
    undo a clamp of its input: one that divides its input by a group std (a ``norm_by_std``
    parameter that defaults to True: grpo, grpo_passk; a group's z-scores do not change when its
    extreme values are clamped) and the step-wise ones (gigpo, step_reinforce), whose per-step
    value is what ROLL clamps. For grpo after ``mean_std`` normalisation that value is the
    normalised reward itself (its z-score of z-scores is the identity up to epsilon), so the
    result is ROLL's: normalise, clamp, then the reward on every model token."""
    params = inspect.signature(get_estimator(name)).parameters
    by_std = "norm_by_std" in params and params["norm_by_std"].default is True
    return "advantages" if by_std or "step_rows" in estimator_needs(name) else "scores"


def last_positions(mask: Tensor) -> Tensor:
    """Each row's last model token ``[B]`` of ``mask [B, T]``, -1 for a row without one."""
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    return torch.where(mask, positions, -1).max(dim=1).values


def last_token_rewards(per_row: Tensor, mask: Tensor) -> Tensor:
    """``[B, T]`` float32 zeros with each row's ``per_row [B]`` value on its last model token."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    last = last_positions(mask)
    rows = (last >= 0).nonzero().flatten()
    out[rows, last[rows]] = per_row[rows].to(torch.float32)
    return out


def clip_row_values(advantages: Tensor, mask: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    """Clamp each row's value to ``[-clip, clip]``, rows ``[R, T]`` being one value times a fixed
    token pattern (an outcome on every model token, or its reward-to-go): the value is the one on
    the row's last model token, and a clamped row is scaled with it. Returns the rows ``[R, T]``
    (bit-identical where the value is within the clip; exactly ``+-clip`` on a constant row that
    is clamped) and which rows were clamped ``[R]`` bool."""
    last = last_positions(mask)
    value = advantages.gather(1, last.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    value = torch.where(last >= 0, value, torch.zeros_like(value))
    clipped = clip_rewards(value, clip)
    hit = clipped != value
    pattern = advantages / torch.where(hit, value, torch.ones_like(value)).unsqueeze(-1)
    rows = torch.where(hit.unsqueeze(-1), clipped.unsqueeze(-1) * pattern, advantages)
    return rows, hit


def step_rows(
    response_mask: Tensor,
    turn_index: Tensor,
    rewards: Tensor,
    input_ids: Tensor,
    turn_spans: Sequence[Sequence[tuple[int, int]]],
) -> dict[str, Tensor]:
    """One row per (trajectory, turn) with model tokens, from ``response_mask [B, T]`` bool,
    ``turn_index [B, T]`` (-1 outside turns), per-token ``rewards [B, T]``, ``input_ids [B, T]``
    and each row's turn spans ``[(start, end), ...]``: ``row_of [S]``, ``step_ids [S]``,
    ``step_rewards [S]`` (the turn's rewards summed), ``anchor_ids [S]`` (a dense id of the hash
    of the tokens the model saw just before the turn: the observation), ``step_mask [S, T]``
    (the turn's model tokens). A ValueError when no row has a model turn."""
    mask = response_mask
    row_of, steps, step_rewards, anchors, masks = [], [], [], [], []
    anchor_dense: dict[bytes, int] = {}
    for b, spans in enumerate(turn_spans):
        prev_end = 0
        for k, (start, end) in enumerate(spans):
            step_mask = mask[b] & (turn_index[b] >= 0)
            step_mask = step_mask & (torch.arange(mask.shape[1]) >= start)
            step_mask = step_mask & (torch.arange(mask.shape[1]) < end)
            if not bool(step_mask.any()):
                prev_end = end
                continue
            # the observation's token ids as bytes (torch only: rl-algos does not need numpy)
            context = ",".join(map(str, input_ids[b, prev_end:start].tolist())).encode()
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


def estimate_advantages(
    episode_rewards: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    estimator: str = "grpo",
    *,
    method: str = "mean_std",
    gamma: float = 1.0,
    lam: float = 1.0,
    reward_clip: float | None = None,
    whiten: bool = False,
    advantage_clip: float | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = "k1",
    log_probs: Tensor | None = None,
    ref_log_probs: Tensor | None = None,
    values: Tensor | None = None,
    baseline_scores: Tensor | None = None,
    steps: Mapping[str, Tensor] | None = None,
    sum_pi_squared: Tensor | None = None,
    step_gamma: float = 0.95,
    step_weight: float = 1.0,
    episode_weight: float = 1.0,
) -> dict[str, Tensor]:
    """Advantages of a batch (the steps in the module docstring), pure: inputs are not changed.

    Args:
        episode_rewards: ``[B]`` one reward per row.
        response_mask: ``[B, T]`` bool, the model tokens.
        group_ids: ``[B]`` long, the groups of reward normalisation (and of group estimators).
        estimator: a registered name (`rl_algos.advantages.list_estimators`).
        method: reward normalisation within the groups.
        gamma, lam: the estimator's discount (token level) and GAE's lambda.
        reward_clip: clamp of the normalised rewards (None: none), where `reward_clip_site` says.
        whiten, advantage_clip: masked whitening, then a clamp of the advantages (None or 0: none).
        kl_coef, kl_kind: the reward KL penalty's coefficient (0: none) and estimator
            (`rl_algos.losses.kl_penalty` names); it needs ``log_probs`` and ``ref_log_probs``
            ``[B, T]``.
        values: ``[B, T]`` critic values (estimators that need them).
        baseline_scores: ``[B]`` episode rewards of greedy rollouts of the same prompts (remax),
            normalised (and clamped) like the scores.
        steps: the step rows (`step_rows`) of a step-wise estimator.
        sum_pi_squared: ``[B, T]`` ``sum_v pi(v)^2`` of the old policy per token; with
            ``log_probs`` (that policy's log-probs of the sampled tokens) for
            optimal_token_baseline.
        step_gamma, step_weight, episode_weight: the step-wise estimators' discount across turns
            and GiGPO's step/episode weights.

    Returns:
        ``advantages [B, T]`` and ``returns [B, T]`` float32, zero outside the mask; ``scores
        [B]``, the normalised (clamped) rewards the estimator took; with ``kl_coef > 0`` the
        per-token reward ``kl [B, T]``; with ``reward_clip`` the fraction it clamped,
        ``reward_clip_frac`` (a scalar: of the scores, the rows or the step rows).
    """
    mask = response_mask
    needs = estimator_needs(estimator)
    fn = get_estimator(estimator)
    params = inspect.signature(fn).parameters
    scores = normalize_rewards(
        episode_rewards.to(torch.float32), grouping="group", index=group_ids, method=method
    )
    out: dict[str, Tensor] = {}
    clip_scores = reward_clip is not None and reward_clip_site(estimator) == "scores"
    if clip_scores:
        clipped = clip_rewards(scores, reward_clip)
        out["reward_clip_frac"] = (clipped != scores).to(torch.float32).mean()
        scores = clipped
    out["scores"] = scores
    rewards: Tensor = scores
    if kl_coef > 0 or "values" in needs:
        rewards = last_token_rewards(scores, mask)
    if kl_coef > 0:
        if log_probs is None or ref_log_probs is None:
            raise ValueError("a reward KL penalty needs log_probs and ref_log_probs")
        rewards, kl = apply_kl_penalty(
            rewards, log_probs, ref_log_probs, mask.to(torch.float32), kl_coef, kl_kind
        )
        out["kl"] = kl
    kwargs: dict[str, object] = {}
    if "gamma" in params:
        kwargs["gamma"] = step_gamma if "step_rows" in needs else gamma
    if "values" in needs:
        if values is None:
            raise ValueError(f"adv_estimator={estimator} needs critic values (configure a critic)")
        adv, ret = fn(rewards, values.to(torch.float32), mask, lam=lam, **kwargs)
    elif "step_rows" in needs:
        if steps is None:
            raise ValueError(f"adv_estimator={estimator} needs the batch's step rows")
        row_of = steps["row_of"]
        offered = {
            "traj_ids": row_of,
            "step_ids": steps["step_ids"],
            "step_rewards": steps["step_rewards"],
            "anchor_ids": steps["anchor_ids"],
            "step_weight": step_weight,
            "episode_weight": episode_weight,
            "token_gamma": gamma,
            "method": method,
        }
        step_kwargs = {k: v for k, v in offered.items() if k in params}
        step_adv, _ = fn(
            scores[row_of], steps["step_mask"], group_ids[row_of], **step_kwargs, **kwargs
        )
        step_adv = step_adv.float()
        if reward_clip is not None:
            step_adv, hit = clip_row_values(step_adv, steps["step_mask"], reward_clip)
            out["reward_clip_frac"] = hit.to(torch.float32).mean()
        adv = torch.zeros(mask.shape, dtype=torch.float32).index_add_(0, row_of, step_adv)
        ret = adv
    else:
        if "baseline_scores" in needs:
            if baseline_scores is None:
                raise ValueError(
                    f"adv_estimator={estimator} needs baseline_scores (greedy rollouts)"
                )
            baseline = normalize_rewards(
                baseline_scores.to(torch.float32), grouping="group", index=group_ids, method=method
            )
            kwargs["baseline_scores"] = (
                clip_rewards(baseline, reward_clip) if clip_scores else baseline
            )
        if "sum_pi_squared" in needs:
            if log_probs is None or sum_pi_squared is None:
                raise ValueError(
                    f"adv_estimator={estimator} needs the old policy's log_probs and sum_pi_squared"
                )
            kwargs["old_log_probs"], kwargs["sum_pi_squared"] = log_probs, sum_pi_squared
        adv, ret = fn(rewards, mask, group_ids, **kwargs)
        if reward_clip is not None and not clip_scores:  # the estimator's per-row value
            clipped_adv, hit = clip_row_values(adv.to(torch.float32), mask, reward_clip)
            out["reward_clip_frac"] = hit.to(torch.float32).mean()
            adv, ret = clipped_adv, (clipped_adv if ret is adv else ret)
    adv = adv.to(torch.float32)
    if whiten:
        adv = masked_whiten(adv, mask)
    if advantage_clip is not None and advantage_clip > 0:
        adv = adv.clamp(-advantage_clip, advantage_clip)
    out["advantages"] = adv * mask
    out["returns"] = ret.to(torch.float32) * mask
    return out
