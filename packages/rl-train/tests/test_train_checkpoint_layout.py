"""The one checkpoint layout (rl_train.checkpoint_store): names, directories of the earlier
`step_<N>` layout read as the same step, and a full disk during a collective save."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from rl_train import checkpoint as ckpt
from rl_train import checkpoint_store as store


def _save(root: Path, step: int, keep_last: int | None = None) -> Path:
    tmp = ckpt.begin(root, step)
    (tmp / "weights.bin").write_bytes(bytes([step]) * 8)
    return ckpt.commit(root, step, tmp, keep_last=keep_last)


@pytest.mark.parametrize(
    ("name", "step"),
    [("step-000010", 10), ("step-1234567", 1234567), ("step_00000010", 10), ("step-", None),
     ("step-1e3", None), ("step--1", None), ("step-\u0661", None), ("steps-1", None)],
)  # fmt: skip
def test_a_directory_name_says_its_step(name, step):
    assert store.dir_step(Path("/x") / name) == step


def test_every_save_writes_the_one_name_and_the_earlier_name_still_resumes(tmp_path):
    root = tmp_path / "ck"
    first = _save(root, 1)
    assert first.name == "step-000001" == store.step_dir_name(1)
    legacy = root / "step_00000001"  # what rl_train wrote before there was one layout
    first.rename(legacy)
    assert ckpt.verify(legacy)  # the signed step (1) is the step its earlier name says
    assert ckpt.latest_checkpoint(root) == legacy
    loaded, _report = ckpt.load_newest_valid(root, lambda path, _report: path)
    assert loaded == legacy
    second = _save(root, 2, keep_last=1)  # a resumed run saves under the new name ...
    assert second.name == "step-000002"
    assert ckpt.committed_checkpoints(root) == [second]  # ... and prunes the earlier one


def test_of_two_names_for_one_step_the_current_one_is_preferred(tmp_path):
    root = tmp_path / "ck"
    current = _save(root, 3)
    legacy = root / "step_00000003"
    legacy.mkdir()  # planted, unsigned: it must neither win nor push the real one out
    manager = store.CheckpointManager(root, keep_last=1)
    assert manager.present() == [legacy, current]
    assert manager.latest() == current


def test_a_full_disk_during_a_collective_save_says_so_and_keeps_the_last_checkpoint(
    tmp_path, monkeypatch
):
    root = tmp_path / "ck"
    first = _save(root, 1)

    def full(_directory):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "fsync_tree", full)
    tmp = ckpt.begin(root, 2)
    (tmp / "weights.bin").write_bytes(b"x")
    with pytest.raises(store.CheckpointSpaceError, match="no space left .* step 2") as caught:
        ckpt.commit(root, 2, tmp, keep_last=1)
    assert caught.value.errno == errno.ENOSPC
    assert sorted(p.name for p in root.iterdir()) == [first.name]  # the partial is gone
    assert ckpt.latest_checkpoint(root) == first


def test_cleanup_removes_leftovers_of_both_layouts(tmp_path):
    root = tmp_path / "ck"
    kept = _save(root, 1)
    for name in (".tmp-step-000002", ".old-step-000001", ".tmp_step_00000002"):
        (root / name).mkdir()
    store.CheckpointManager(root).cleanup()
    assert sorted(p.name for p in root.iterdir()) == [kept.name]
