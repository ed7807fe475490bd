import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    from rl_rollout.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("rl_train_tiny") / "model"))


@pytest.fixture(scope="session")
def tiny_model_tied_path(tmp_path_factory) -> str:
    from rl_rollout.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("rl_train_tiny2") / "model", seed=1))


@pytest.fixture(scope="session", autouse=True)
def checkpoint_key_file(tmp_path_factory):
    """Sign test checkpoints with a throwaway key (inherited by spawned ranks), never the user's."""
    from rl_train.testing import throwaway_checkpoint_key

    with throwaway_checkpoint_key(tmp_path_factory.mktemp("ckpt_key")) as path:
        yield path


@pytest.fixture(scope="session")
def resumed_training_settings() -> dict:
    """Training args a resumed run gives that differ from the checkpointed run's in every
    optimizer and schedule setting (the resume tests assert they apply after the load): linear
    decay from 1e-4 to a floor of 0.5e-4 over 10 steps."""
    return dict(
        learning_rate=1e-4,
        weight_decay=0.1,
        adam_beta1=0.8,
        adam_beta2=0.99,
        adam_epsilon=1e-7,
        lr_scheduler_type="linear",
        warmup_steps=0,
        max_steps=10,
        min_lr_ratio=0.5,
    )
