"""Someone who can write the checkpoint root but has no key: a malformed signature or manifest, a
signed checkpoint renamed to a newer step or copied from another run, a symlinked step directory
or a planted directory with a large step. Each is refused naming the file, resume falls back to
the newest real checkpoint, and pruning never removes a real one in their favour."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rl_train import checkpoint as ckpt
from rl_train import signing
from rl_train.testing import MALFORMED_SIGNATURES, plant_malformed_signature


def _save(root: Path, step: int, keep_last: int | None = None) -> Path:
    tmp = ckpt.begin(root, step)
    (tmp / "weights.bin").write_bytes(bytes([step]) * 8)
    return ckpt.commit(root, step, tmp, keep_last=keep_last)


def _resume(root: Path) -> tuple[Path, ckpt.LoadReport]:
    """What a backend's load_checkpoint does, without a model: the directory it would load."""
    loaded, report = ckpt.load_newest_valid(root, lambda path, _report: path)
    return loaded, report


@pytest.mark.timeout(60)  # a FIFO read without O_NONBLOCK would block here
@pytest.mark.parametrize("form", MALFORMED_SIGNATURES)
def test_malformed_signature_is_skipped_and_resume_falls_back(tmp_path, form):
    root = tmp_path / "ck"
    older = _save(root, 1)
    newer = _save(root, 2)
    plant_malformed_signature(newer, form)
    with pytest.raises(signing.CheckpointError, match=f"{newer}: .*MANIFEST.hmac") as err:
        ckpt.verify(newer)
    assert "is larger than 4096 bytes" in str(err.value) or form != "oversized"
    assert ckpt.latest_checkpoint(root) == older
    loaded, report = _resume(root)
    assert loaded == older
    assert [(p, "MANIFEST.hmac" in why) for p, why in report.rejected] == [(newer, True)]


def test_oversized_or_special_manifest_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "ck"
    older = _save(root, 1)
    newer = _save(root, 2)
    monkeypatch.setattr(signing, "MAX_MANIFEST_BYTES", 100)
    with pytest.raises(signing.CheckpointError, match="file MANIFEST.json is larger than 100"):
        ckpt.verify(newer)
    monkeypatch.undo()
    manifest = newer / "MANIFEST.json"
    manifest.unlink()
    os.mkfifo(manifest)
    with pytest.raises(signing.CheckpointError, match="MANIFEST.json is not a regular file"):
        ckpt.verify(newer)
    manifest.unlink()
    manifest.symlink_to(older / "MANIFEST.json")
    with pytest.raises(signing.CheckpointError, match="cannot open file MANIFEST.json"):
        ckpt.verify(newer)
    assert _resume(root)[0] == older


def test_renamed_signed_checkpoint_is_refused_and_never_prunes_the_real_ones(tmp_path):
    root = tmp_path / "ck"
    for step in (1, 2, 3):
        _save(root, step)
    os.rename(root / "step-000001", root / "step-009999")  # "newest" by name
    with pytest.raises(
        signing.CheckpointError,
        match="step-009999: MANIFEST.json is signed for step 1, but the directory is step 9999",
    ):
        ckpt.verify(root / "step-009999")
    assert _resume(root)[0] == root / "step-000003"
    _save(root, 4, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == [
        "step-000003",
        "step-000004",
        "step-009999",  # not counted as one of the two kept, and left alone
    ]


def test_checkpoint_from_another_run_under_a_newer_name_is_refused(tmp_path):
    other = _save(tmp_path / "other_run", 7)  # same user, same key
    root = tmp_path / "ck"
    _save(root, 1)
    shutil.copytree(other, root / "step-000008")
    assert _resume(root)[0] == root / "step-000001"


def test_symlinked_step_directory_is_refused(tmp_path):
    other = _save(tmp_path / "other_run", 5)
    root = tmp_path / "ck"
    _save(root, 1)
    (root / "step-000005").symlink_to(other, target_is_directory=True)
    with pytest.raises(signing.CheckpointError, match="step-000005 is a symlink"):
        ckpt.verify(root / "step-000005")
    assert _resume(root)[0] == root / "step-000001"


def test_planted_unsigned_directory_with_a_large_step_does_not_prune_real_ones(tmp_path):
    root = tmp_path / "ck"
    _save(root, 1)
    for name in ("step-009998", "step-009999"):
        (root / name).mkdir()
        (root / name / ckpt.MARKER).write_text("{}")
    _save(root, 2, keep_last=2)
    _save(root, 3, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == [
        "step-000002",
        "step-000003",
        "step-009998",
        "step-009999",
    ]
    assert _resume(root)[0] == root / "step-000003"


def test_trust_signs_for_the_step_the_name_says(tmp_path, capsys):
    saved = _save(tmp_path / "ck", 4)
    (saved / "MANIFEST.hmac").unlink()
    assert signing.main(["trust", str(saved)]) == 0
    assert json.loads((saved / "MANIFEST.json").read_text())["step"] == 4
    ckpt.verify(saved)
    assert signing.main(["verify", str(saved)]) == 0
    with pytest.raises(SystemExit):
        signing.main(["trust", str(saved), "--step", "5"])
    assert "step-000004 is step 4" in capsys.readouterr().err
