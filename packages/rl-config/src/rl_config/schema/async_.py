"""Asynchronous (off-policy) training: how far rollout may run ahead of the trainer."""

from __future__ import annotations

from pydantic import Field

from rl_config.schema.base import StrictModel


class AsyncConfig(StrictModel):
    """The ``async`` section. Units: weight versions for staleness, samples for queues."""

    max_staleness: int | None = Field(
        default=None,
        ge=0,
        description="Weight versions a sample may lag: a sample generated with weights of "
        "version v is trained at trainer version t only if t - v <= max_staleness; older "
        "samples are dropped. 0 = on-policy (synchronous). Unset: ceil(async_generation_ratio).",
    )
    queue_size: int | None = Field(
        default=None,
        ge=1,
        description="Capacity of the rollout -> trainer queue, in samples (trajectories), not "
        "prompts. Unset: samples_per_step × max(1, max_staleness).",
    )
    partial_rollout: bool = Field(
        default=False,
        description="On a weight update, abort in-flight generations and resume them with the "
        "new weights (tokens keep the version that produced them).",
    )
    max_inflight_samples: int | None = Field(
        default=None,
        ge=1,
        description="Samples being generated at once at most (backpressure); unset: queue_size.",
    )
