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
