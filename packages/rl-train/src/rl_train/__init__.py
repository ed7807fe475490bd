"""FSDP2 and DeepSpeed training backends for actor, critic and reference.

backend = rl_train.build_backend("fsdp2_train", role="actor", model_path=path,
                                 strategy_config={}, training_args={...})
out = backend.forward(batch)                    # log_probs [B, T]
metrics = backend.train_step(batch, loss_fn)    # ppo_epochs x mini x micro batches
"""

from importlib.metadata import PackageNotFoundError, version

from rl_train.args import (
    LogprobSampling,
    ModelArgs,
    TrainingArgs,
    parse_model_args,
    parse_training_args,
)
from rl_train.checkpoint import CheckpointError, committed_checkpoints, latest_checkpoint
from rl_train.guard import NonFiniteTrainingError
from rl_train.protocol import TrainBackend
from rl_train.registry import available_backends, build_backend, register_backend
from rl_train.types import Batch, ForwardOutput, LossContext, LossFn

try:
    __version__ = version("rl-train")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"

__all__ = [
    "Batch",
    "CheckpointError",
    "ForwardOutput",
    "LogprobSampling",
    "LossContext",
    "LossFn",
    "ModelArgs",
    "NonFiniteTrainingError",
    "TrainBackend",
    "TrainingArgs",
    "available_backends",
    "build_backend",
    "committed_checkpoints",
    "latest_checkpoint",
    "parse_model_args",
    "parse_training_args",
    "register_backend",
]
