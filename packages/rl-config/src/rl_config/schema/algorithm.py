"""Algorithm knobs (PPO/GRPO and friends). Top-level keys, as in ROLL's PPOConfig."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rl_config.schema.base import StrictModel

AdvEstimatorName = Literal[
    "gae",
    "grpo",
    "dr_grpo",
    "reinforce",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "gpg",
    "grpo_passk",
    "gigpo",
    "step_reinforce",
    "optimal_token_baseline",
]
#: Estimators defined on raw rewards with a baseline of their own and no per-group std: a
#: reward_normalization that divides by the group std first changes the algorithm (dr_grpo
#: becomes exactly grpo, rloo's leave-one-out runs on z-scores).
STD_FREE_ESTIMATORS = frozenset(
    {
        "dr_grpo",
        "rloo",
        "reinforce_pp",
        "reinforce_plus_plus",
        "reinforce_pp_baseline",
        "reinforce_plus_plus_baseline",
        "remax",
        "opo",
        "gpg",
        "optimal_token_baseline",
    }
)
STD_SCALING_METHODS = ("mean_std", "asym_clip")
KlKind = Literal["kl", "k1", "abs", "mse", "k2", "k3", "low_var_kl", "full"]
LossAggMode = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]


class RewardNormalization(StrictModel):
    """How episode rewards are normalised into advantages (agentic pipelines)."""

    grouping: Literal["traj_group_id", "state", "tags", "batch"] = Field(
        default="traj_group_id",
        description="Statistics are taken over: traj_group_id (the G trajectories of one env group, "
        "same env and seed; `state` is ROLL's alias), tags (all trajectories of one env tag) or "
        "batch (the whole rollout batch).",
    )
    method: Literal["mean_std", "mean", "asym_clip", "identity"] = Field(
        default="mean_std",
        description="mean_std: (r - mean) / (std + eps); mean: r - mean; asym_clip: mean_std then clip negative "
        "scores; identity: rewards unchanged.",
    )


class DynamicSampling(StrictModel):
    """DAPO dynamic sampling: drop groups whose rewards carry no signal."""

    enable: bool = Field(
        default=False,
        description="Drop groups whose samples all have the same reward (zero advantage).",
    )
    max_num_gen_batches: int = Field(
        default=0,
        ge=0,
        description="Extra rollout batches generated at most to refill dropped groups; 0 = "
        "unlimited.",
    )


class OverlongPenalty(StrictModel):
    """DAPO soft overlong punishment for responses near the length limit."""

    enable: bool = Field(
        default=False, description="Penalise responses that enter the overlong buffer."
    )
    buffer_length: int = Field(
        default=256,
        ge=1,
        description="Tokens before the response limit where the penalty ramps from 0 to -factor.",
    )
    penalty_factor: float = Field(default=1.0, ge=0, description="Penalty at the length limit.")


class ISWeight(StrictModel):
    """Importance weights between the training and the rollout policy (mismatch correction)."""

    enabled: bool = Field(
        default=False,
        description="Multiply the policy loss by exp(old_log_probs - rollout_log_probs), truncated.",
    )
    weight_type: Literal["token", "segment", "geometric", "sequence"] = Field(
        default="token",
        description="Granularity: per token, per turn segment, geometric mean over the sequence, "
        "or product over the sequence.",
    )
    upper_bound: float | None = Field(
        default=1.2,
        gt=0,
        description="Truncate weights above this (TIS); null disables truncation.",
    )
    detach: bool = Field(default=True, description="Stop gradients through the weight.")


class ISFilter(StrictModel):
    """A rule that masks tokens/sequences whose train/rollout mismatch is too large."""

    enabled: bool = Field(default=False, description="Apply this filter to response_mask.")
    agg_type: Literal["token", "segment", "geometric", "sequence"] = Field(
        default="token", description="Level at which the ratio is aggregated before comparing."
    )
    ratio_enabled: bool = Field(default=True, description="Filter on exp(old - rollout log-prob).")
    ratio_low: float = Field(default=0.8, ge=0, description="Mask where the ratio is below this.")
    ratio_high: float = Field(default=1.2, gt=0, description="Mask where the ratio is above this.")
    diff_enabled: bool = Field(
        default=False, description="Filter on exp(old) - exp(rollout) prob diff."
    )
    diff_low: float = Field(
        default=-0.2, description="Mask where the probability diff is below this."
    )
    diff_high: float = Field(
        default=0.2, description="Mask where the probability diff is above this."
    )


class TrainInferCorrection(StrictModel):
    """Correction for the mismatch between the rollout engine and the trainer (IS correction)."""

    is_weight: ISWeight = Field(default_factory=ISWeight, description="Importance weights.")
    filters: list[ISFilter] = Field(
        default_factory=list, description="Masking rules applied in order to response_mask."
    )


class AlgorithmFields(StrictModel):
    """PPO/GRPO knobs, flat at the top level like ROLL's PPOConfig."""

    adv_estimator: AdvEstimatorName = Field(
        default="grpo",
        description="Advantage estimator (rl_algos registry name; a test keeps this list equal to "
        "the registry): gae (needs a critic), grpo, dr_grpo, reinforce, rloo, reinforce_pp "
        "(= reinforce_plus_plus), reinforce_pp_baseline (= reinforce_plus_plus_baseline), remax "
        "(greedy baseline rollouts), opo, gpg, grpo_passk, gigpo (per-turn steps), step_reinforce (ROLL's per-step "
        "REINFORCE: each turn's discounted return, normalised), optimal_token_baseline (a baseline per group and response position, weighted by each row's accumulated variance proxy 1 - 2 pi + sum pi^2 from the trainer's log-probs). Reward normalisation (reward_normalization) runs first; group estimators use its groups. dr_grpo, rloo, reinforce_pp(_baseline), remax, opo, gpg and optimal_token_baseline bring their own baseline and no group std: they need reward_normalization.method identity (or mean).",
    )
    ppo_epochs: int = Field(
        default=1,
        ge=1,
        description="Optimisation passes over each rollout batch per pipeline step.",
    )
    max_grad_norm: float = Field(
        default=1.0, gt=0, description="Gradient clipping: max global L2 norm of the gradient."
    )
    l2: float = Field(
        default=0.0, ge=0, description="L2 regularisation coefficient on the weights."
    )
    gamma: float = Field(
        default=1.0, ge=0, le=1, description="Discount factor per token (GAE/returns)."
    )
    lambd: float = Field(
        default=0.95, ge=0, le=1, description="GAE lambda (bias/variance trade-off)."
    )
    pg_clip: float | None = Field(
        default=0.2, gt=0, description="PPO ratio clip epsilon: ratio is clipped to [1-eps, 1+eps]."
    )
    use_pg_clip_range: bool = Field(
        default=False,
        description="Use the asymmetric range [1-pg_clip_low, 1+pg_clip_high] (clip-higher, DAPO) "
        "instead of pg_clip.",
    )
    pg_clip_low: float | None = Field(
        default=0.2, gt=0, description="Lower clip epsilon when use_pg_clip_range is true."
    )
    pg_clip_high: float | None = Field(
        default=0.2,
        gt=0,
        description="Upper clip epsilon when use_pg_clip_range is true (e.g. 0.28).",
    )
    dual_clip_loss: bool = Field(
        default=False,
        description="Dual-clip PPO: bound the loss of negative-advantage tokens by dual_clip_c.",
    )
    dual_clip_c: float = Field(default=3.0, gt=1, description="Dual-clip constant c (> 1).")
    value_clip: float | None = Field(
        default=None,
        gt=0,
        description="Clip value predictions to old_values ± value_clip (critic loss).",
    )
    kl_penalty: KlKind = Field(
        default="kl",
        description="KL estimator for the reward penalty: kl/k1 = log_probs - ref_log_probs; abs; "
        "mse/k2 = 0.5·(log ratio)²; k3/low_var_kl; full (exact KL over the vocabulary) is refused: "
        "the train step has no reference logits.",
    )
    init_kl_coef: float = Field(
        default=0.0,
        ge=0,
        description="Initial coefficient of the KL reward penalty (fixed or adaptive "
        "controller). > 0 enables the reference worker. ROLL's default is 0.2; ours is 0.",
    )
    target_kl: float | None = Field(
        default=None, gt=0, description="Target KL per step of the adaptive KL controller."
    )
    kl_horizon: int = Field(
        default=10000, ge=1, description="Horizon (steps) of the adaptive controller."
    )
    adaptive_kl_ctrl: bool | None = Field(
        default=None,
        description="KL controller: true = adaptive (needs target_kl), false = fixed; unset = "
        "adaptive iff target_kl is set (ROLL behaviour).",
    )
    add_token_level_kl: bool = Field(
        default=False, description="Subtract init_kl_coef × KL from the token-level rewards."
    )
    use_kl_loss: bool = Field(
        default=False,
        description="Add kl_loss_coef × KL(actor || reference) to the actor loss (GRPO).",
    )
    kl_loss_coef: float = Field(default=0.0, ge=0, description="Coefficient of the KL loss.")
    kl_loss_type: KlKind = Field(
        default="k3", description="KL estimator of the KL loss (k3 = low_var_kl)."
    )
    entropy_loss_coef: float = Field(
        default=0.0, description="Coefficient of the entropy bonus (loss -= coef × entropy)."
    )
    sft_loss_coef: float = Field(
        default=0.0, ge=0, description="Coefficient of an SFT loss on positive samples."
    )
    rl_loss_coef: float = Field(
        default=1.0, ge=0, description="Coefficient of the policy-gradient loss."
    )
    use_topr_loss: bool = Field(
        default=False, description="Use the TOPR loss (see pg_variant: topr)."
    )
    loss_agg_mode: LossAggMode = Field(
        default="seq-mean-token-mean",
        description="How the [B, T] loss matrix becomes a scalar: token-mean, seq-mean-token-sum, "
        "seq-mean-token-mean, seq-mean-token-sum-norm.",
    )
    critic_warmup: int = Field(
        default=0, ge=0, description="Pipeline steps that train only the critic before the actor."
    )
    use_reward_scaling: bool = Field(default=False, description="Scale rewards by running std.")
    use_reward_norm: bool = Field(
        default=False, description="Normalise rewards (only with use_reward_scaling)."
    )
    reward_norm: Literal["batch", "group", "running"] | None = Field(
        default=None,
        description="Reward normalisation scope: batch, group (per prompt group), running "
        "statistics, or null (none). RLVR pipelines.",
    )
    norm_mean_type: Literal["batch", "group", "running"] | None = Field(
        default=None, description="Scope of the mean subtracted from rewards; null: not subtracted."
    )
    norm_std_type: Literal["batch", "group", "running"] | None = Field(
        default=None, description="Scope of the std rewards are divided by; null: not divided."
    )
    reward_shift: bool = Field(
        default=False, description="When normalising, only subtract the mean (no division)."
    )
    reward_scale: bool = Field(
        default=False, description="When normalising, only divide by the std (no centering)."
    )
    reward_clip: float | None = Field(
        default=None,
        gt=0,
        description="Clamp the normalised rewards to [-reward_clip, reward_clip] (as ROLL: after "
        "reward_normalization, before the advantage estimator; train/reward_clip_frac logs the "
        "fraction clamped).",
    )
    whiten_rewards: bool = Field(default=False, description="Whiten rewards (zero mean, unit var).")
    whiten_advantages: bool = Field(
        default=False, description="Whiten advantages over the batch's response tokens."
    )
    advantage_clip: float | None = Field(
        default=None, gt=0, description="Clip advantages to [-advantage_clip, advantage_clip]."
    )
    add_len_reward: bool = Field(default=False, description="Add a response-length reward term.")
    difficulty_loss_weight: bool = Field(
        default=False,
        description="Weight the loss of a prompt by its difficulty (group pass rate).",
    )
    length_loss_weight: bool = Field(
        default=False, description="Weight the loss of a sample by its response length."
    )
    max_len_mask: bool = Field(
        default=False,
        description="Mask truncated responses (finish_reason=length) out of the loss.",
    )
    difficulty_mask: bool = Field(
        default=False,
        description="ROLL's difficulty filter: train only on prompt groups whose mean score lies "
        "strictly between difficulty_low_threshold and difficulty_high_threshold (the others "
        "stay in the batch statistics, masked out of the loss).",
    )
    difficulty_low_threshold: float = Field(
        default=0.0, description="difficulty_mask: a group's mean score must be above this."
    )
    difficulty_high_threshold: float = Field(
        default=1.0, description="difficulty_mask: a group's mean score must be below this."
    )
    dynamic_sampling: DynamicSampling = Field(
        default_factory=DynamicSampling, description="DAPO dynamic sampling."
    )
    overlong_penalty: OverlongPenalty = Field(
        default_factory=OverlongPenalty, description="DAPO soft overlong punishment."
    )
    train_infer_correction: TrainInferCorrection = Field(
        default_factory=TrainInferCorrection,
        description="Train/inference mismatch correction (IS weights and filters).",
    )
    reward_normalization: RewardNormalization = Field(
        default_factory=RewardNormalization,
        description="Episode reward normalisation of agentic pipelines (grouping and method).",
    )
    episode_reward_weight: float = Field(
        default=1.0, description="GiGPO: weight of the episode-level advantage."
    )
    step_reward_weight: float = Field(
        default=1.0, description="GiGPO: weight of the step-level advantage."
    )
    step_reward_gamma: float = Field(
        default=0.95,
        ge=0,
        le=1,
        description="Discount of step rewards across turns (gigpo, step_reinforce).",
    )
