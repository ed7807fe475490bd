import pytest


@pytest.fixture(scope="session", autouse=True)
def checkpoint_key_file(tmp_path_factory):
    """Sign test checkpoints with a throwaway key (inherited by the app subprocesses and Ray
    workers), never the user's ~/.config/rl-stack/checkpoint.key."""
    from rl_train.testing import throwaway_checkpoint_key

    with throwaway_checkpoint_key(tmp_path_factory.mktemp("ckpt_key")) as path:
        yield path
