"""Step metrics from trajectories: `env/*` outcomes, `rollout/*` lengths, `val/*` per tag."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean
from typing import Any

from rl_runtime.step.collate import CollatedBatch
from rl_runtime.step.failures import failure_kind


def _outcomes(trajectories: Sequence[Any], prefix: str) -> dict[str, float]:
    if not trajectories:
        return {}
    out = {
        f"{prefix}/success_rate": mean(float(t.success) for t in trajectories),
        f"{prefix}/episode_reward": mean(float(t.episode_reward) for t in trajectories),
        f"{prefix}/num_turns": mean(float(len(t.turns)) for t in trajectories),
        # any kind (rl_runtime.step.failures): the env/engine raised, an env step timed out, or a
        # turn's grader failed (its reward 0 is not data: a broken grader is not a bad policy)
        f"{prefix}/failed": mean(float(failure_kind(t) is not None) for t in trajectories),
        # ended by the token budget (agentic: sequence_length; RLVR: the response budget), not
        # by the env: a budget too small for the game shows here, not as a silent 0 success
        f"{prefix}/length_truncated": mean(
            float(t.termination_reason == "max_length") for t in trajectories
        ),
        f"{prefix}/format_ok": mean(
            mean(float(turn.format_ok) for turn in t.turns) if t.turns else 0.0
            for t in trajectories
        ),
    }
    tags = sorted({t.tag for t in trajectories})
    if len(tags) > 1 or prefix.startswith("val"):
        for tag in tags:
            sub = [t for t in trajectories if t.tag == tag]
            out[f"{prefix}/{tag}/success_rate"] = mean(float(t.success) for t in sub)
            out[f"{prefix}/{tag}/episode_reward"] = mean(float(t.episode_reward) for t in sub)
    return out


TRAINED_SAMPLES_KEY = "rollout/num_trajectories"
"""The step metric counting the samples train_step got (the rows of the collated batch, failed
episodes already screened out): the source of the run's `throughput` and of
`async/trained_samples_total`."""

SKIPPED_KEY = "train/skipped"
"""The step metric (1.0) of a step that trained on nothing: dynamic sampling kept no group, or
asynchronous training found every sample too stale (`skip_reason` says which)."""


def skip_reason(metrics: dict[str, float]) -> str | None:
    """Why a step trained on nothing (its `SKIPPED_KEY` metric set), in words for the step line;
    None for a step that trained."""
    if not metrics.get(SKIPPED_KEY):
        return None
    if metrics.get("dynamic_sampling/kept_groups", 1.0) == 0:
        return "no group kept"
    if metrics.get("async/dropped_stale_samples", 0.0) > 0:
        return "every sample too stale"
    return "nothing to train on"


def rollout_metrics(trajectories: Sequence[Any], batch: CollatedBatch) -> dict[str, float]:
    """`env/*` episode outcomes (`env/length_truncated`: the share of episodes the token budget
    ended) and `rollout/*` token counts of a training rollout (`rollout/truncated`: sequences
    the collation cut at its `max_length`, agentic's `sequence_length`; not logged when the batch
    was collated without one, as RLVR's is: nothing can be cut there, and its responses the
    length budget ended are `env/length_truncated` and `response/truncated_rate`);
    `rollout/resumed_samples`: samples whose tokens span several weight versions (partial
    rollout swapped weights in mid-generation)."""
    out = _outcomes(trajectories, "env")
    mask = batch.tensors["response_mask"]
    lengths = batch.tensors["attention_mask"].sum(-1).float()
    out["rollout/response_tokens"] = float(mask.sum(-1).float().mean())
    out["rollout/sequence_length"] = float(lengths.mean())
    out["rollout/sequence_length_max"] = float(lengths.max())
    if batch.max_length is not None:
        out["rollout/truncated"] = float(batch.num_truncated)
    out[TRAINED_SAMPLES_KEY] = float(batch.batch_size)
    versions = batch.tensors["weight_version"]
    out["rollout/weight_version"] = float(versions.float().mean())
    out["rollout/resumed_samples"] = float(sum(map(_spans_versions, trajectories)))
    return out


def _spans_versions(trajectory: Any) -> bool:
    """Whether the model tokens of `trajectory` were sampled under more than one weight version
    (a generation that partial rollout continued under newer weights)."""
    versions, mask = trajectory.token_versions, trajectory.response_mask
    return bool(versions) and len({v for v, m in zip(versions, mask, strict=True) if m}) > 1


def val_metrics(trajectories: Sequence[Any], prefix: str = "val") -> dict[str, float]:
    """`<prefix>/success_rate`, `<prefix>/episode_reward` overall and per tag, `<prefix>/failed`
    (the share of failed episodes, of any kind)."""
    return _outcomes(trajectories, prefix)
