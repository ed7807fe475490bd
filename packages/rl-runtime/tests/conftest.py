import pytest


@pytest.fixture(scope="session", autouse=True)
def checkpoint_key_file(tmp_path_factory):
    """Sign test checkpoints with a throwaway key (inherited by Ray workers), never the user's."""
    from rl_train.testing import throwaway_checkpoint_key

    with throwaway_checkpoint_key(tmp_path_factory.mktemp("ckpt_key")) as path:
        yield path


# the RLVR pipeline's tests (test_runtime_rlvr*.py)
@pytest.fixture(scope="module")
def tok():
    from rl_rollout.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def arith(tmp_path_factory) -> tuple[str, str]:
    """100 `a+b=` prompts, 55 problems (`a+b` = `b+a`): the 81 prompts of 44 problems for training,
    one prompt each of the other 11 held out (train.parquet, test.parquet)."""
    from rl_envs.tasks.arith import write_arith_parquet

    out = tmp_path_factory.mktemp("arith")
    train, val = write_arith_parquet(str(out), kind="add", max_a=9, max_b=9, val_fraction=0.2,
                                     seed=0)  # fmt: skip
    return str(train), str(val)
