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
