"""The experiment schema (pydantic v2, ``extra="forbid"`` everywhere)."""

from rl_config.schema.agentic import CustomEnv, EnvManagerConfig
from rl_config.schema.algorithm import (
    DynamicSampling,
    ISFilter,
    ISWeight,
    OverlongPenalty,
    RewardNormalization,
    TrainInferCorrection,
)
from rl_config.schema.async_ import AsyncConfig
from rl_config.schema.experiment import ExperimentConfig, WorkerRole
from rl_config.schema.pipeline import CheckpointConfig
from rl_config.schema.rewards import CustomRewardFunction, DomainRewardName, RewardDomain
from rl_config.schema.validation import ValidationConfig
from rl_config.schema.worker import (
    DataArgs,
    GeneratingArgs,
    ModelArgs,
    StrategyArgs,
    TrainingArgs,
    WorkerConfig,
)

__all__ = [
    "AsyncConfig",
    "CheckpointConfig",
    "CustomEnv",
    "CustomRewardFunction",
    "DataArgs",
    "DomainRewardName",
    "DynamicSampling",
    "EnvManagerConfig",
    "ExperimentConfig",
    "GeneratingArgs",
    "ISFilter",
    "ISWeight",
    "ModelArgs",
    "OverlongPenalty",
    "RewardDomain",
    "RewardNormalization",
    "StrategyArgs",
    "TrainInferCorrection",
    "TrainingArgs",
    "ValidationConfig",
    "WorkerConfig",
    "WorkerRole",
]
