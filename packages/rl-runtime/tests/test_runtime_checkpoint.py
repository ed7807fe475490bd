import random

import numpy as np
import pytest
import torch

from rl_runtime.checkpoint import CheckpointManager, RunState, capture_rng, restore_rng


def test_save_latest_and_prune(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        mgr.save(
            RunState(step=step, weight_version=step, env_seed_epoch=step + 10),
            write=lambda d, s=step: (d / "model.txt").write_text(str(s)),
        )
    done = mgr.complete()
    assert [p.name for p in done] == ["step-000002", "step-000003"]
    latest = mgr.latest()
    assert latest is not None and (latest / "model.txt").read_text() == "3"
    state = mgr.load_state(latest)
    assert (state.step, state.weight_version, state.env_seed_epoch) == (3, 3, 13)


def test_interrupted_save_is_ignored_and_previous_kept(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=None)
    mgr.save(RunState(step=1, weight_version=1, env_seed_epoch=1))

    def crash(d):
        (d / "half_written.bin").write_bytes(b"xx")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        mgr.save(RunState(step=2, weight_version=2, env_seed_epoch=2), write=crash)
    assert mgr.latest() == mgr.step_dir(1)
    assert any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())
    mgr.cleanup()
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())
    # a directory without the commit marker is not a checkpoint
    (tmp_path / "step-000009").mkdir()
    assert mgr.latest() == mgr.step_dir(1)
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        mgr.load_state(tmp_path / "step-000009")


def test_resave_same_step_replaces(tmp_path):
    mgr = CheckpointManager(tmp_path)
    mgr.save(RunState(step=4, weight_version=1, env_seed_epoch=0), lambda d: (d / "a").touch())
    mgr.save(RunState(step=4, weight_version=2, env_seed_epoch=0), lambda d: (d / "b").touch())
    p = mgr.latest()
    assert p is not None and (p / "b").exists() and not (p / "a").exists()
    assert mgr.load_state(p).weight_version == 2


def test_resolve(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck")
    assert mgr.resolve(False) is None
    assert mgr.resolve(True) is None  # nothing saved yet: start fresh
    saved = mgr.save(RunState(step=7, weight_version=7, env_seed_epoch=7))
    assert mgr.resolve(True) == saved
    assert mgr.resolve(str(saved)) == saved
    assert mgr.resolve(str(tmp_path / "ck")) == saved
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        mgr.resolve(str(tmp_path / "elsewhere"))


def test_rng_roundtrip_through_checkpoint(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    mgr = CheckpointManager(tmp_path)
    saved = mgr.save(RunState(step=1, weight_version=0, env_seed_epoch=0, rng=capture_rng()))
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    restore_rng(mgr.load_state(saved).rng)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected
