import hashlib
import json
import os
import random
import shutil

import numpy as np
import pytest
import torch

from rl_runtime.state.checkpoint import RunCheckpoints, RunState, capture_rng, restore_rng
from rl_train.signing import CheckpointError, load_key
from rl_train.testing import MALFORMED_SIGNATURES, plant_malformed_signature


def test_save_latest_and_prune(tmp_path):
    mgr = RunCheckpoints(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        mgr.save_run(
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
    mgr = RunCheckpoints(tmp_path, keep_last=None)
    mgr.save_run(RunState(step=1, weight_version=1, env_seed_epoch=1))

    def crash(d):
        (d / "half_written.bin").write_bytes(b"xx")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        mgr.save_run(RunState(step=2, weight_version=2, env_seed_epoch=2), write=crash)
    assert mgr.latest() == mgr.step_dir(1)
    # a failed save removes its partial directory; one left by a killed process goes at cleanup
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())
    (tmp_path / ".tmp-step-000002-999999").mkdir()
    mgr.cleanup()
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())
    # a directory without the commit marker is not a checkpoint
    (tmp_path / "step-000009").mkdir()
    assert mgr.latest() == mgr.step_dir(1)
    with pytest.raises(CheckpointError, match="step-000009 has no COMMITTED marker"):
        mgr.load_state(tmp_path / "step-000009")


def test_resave_same_step_replaces(tmp_path):
    mgr = RunCheckpoints(tmp_path)
    mgr.save_run(RunState(step=4, weight_version=1, env_seed_epoch=0), lambda d: (d / "a").touch())
    mgr.save_run(RunState(step=4, weight_version=2, env_seed_epoch=0), lambda d: (d / "b").touch())
    p = mgr.latest()
    assert p is not None and (p / "b").exists() and not (p / "a").exists()
    assert mgr.load_state(p).weight_version == 2


def test_resolve(tmp_path):
    mgr = RunCheckpoints(tmp_path / "ck")
    assert mgr.resolve(False) is None
    assert mgr.resolve(True) is None  # nothing saved yet: start fresh
    saved = mgr.save_run(RunState(step=7, weight_version=7, env_seed_epoch=7))
    assert mgr.resolve(True) == saved
    assert mgr.resolve(str(saved)) == saved
    assert mgr.resolve(str(tmp_path / "ck")) == saved
    with pytest.raises(CheckpointError, match="no valid checkpoint under .*elsewhere"):
        mgr.resolve(str(tmp_path / "elsewhere"))
    for path in (saved / "run_state.json", tmp_path / "ck" / "step-000009"):
        path.touch()  # a file where a directory is expected (was "none there" / a verify error)
        with pytest.raises(CheckpointError, match=f"{path} is a file; give a checkpoint dir"):
            mgr.resolve(str(path))


def test_rng_roundtrip_through_checkpoint(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    mgr = RunCheckpoints(tmp_path)
    saved = mgr.save_run(RunState(step=1, weight_version=0, env_seed_epoch=0, rng=capture_rng()))
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    restore_rng(mgr.load_state(saved).rng)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def _save(mgr, step, payload=b"weights"):
    def write(d):
        (d / "actor_train").mkdir()
        (d / "actor_train" / "shard.bin").write_bytes(payload + bytes([step]))

    return mgr.save_run(RunState(step=step, weight_version=step, env_seed_epoch=step), write)


def _forge_manifest(ckpt_dir):
    files = {
        p.relative_to(ckpt_dir).as_posix(): {
            "bytes": p.stat().st_size,
            "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
        }
        for p in sorted(ckpt_dir.rglob("*"))
        if p.is_file() and p.name not in ("MANIFEST.json", "MANIFEST.hmac", "COMMITTED")
    }
    (ckpt_dir / "MANIFEST.json").write_text(json.dumps({"format": 1, "step": 0, "files": files}))


def test_latest_verifies_and_falls_back_naming_what_it_skipped(tmp_path, caplog):
    mgr = RunCheckpoints(tmp_path, keep_last=None)
    for step in (1, 2, 3):
        _save(mgr, step)
    shard3 = mgr.step_dir(3) / "actor_train" / "shard.bin"
    shard3.write_bytes(b"X" + shard3.read_bytes()[1:])  # same size, other bytes
    (mgr.step_dir(2) / "run_state.json").write_text('{"step": 99, "weight_version": 0}')
    _forge_manifest(mgr.step_dir(2))  # whoever writes the dir can rewrite a plain manifest
    assert mgr.latest() == mgr.step_dir(1)
    (p3, why3), (p2, why2) = mgr.skipped
    assert p3.name == "step-000003" and "actor_train/shard.bin fails its sha256" in why3
    assert p2.name == "step-000002" and "MANIFEST.json fails its HMAC check" in why2
    assert "skipping checkpoint step-000003" in caplog.text
    assert mgr.resolve(True) == mgr.step_dir(1)
    assert mgr.load_state(mgr.step_dir(1)).step == 1
    with pytest.raises(CheckpointError, match="MANIFEST.json fails its HMAC"):
        mgr.load_state(mgr.step_dir(2))


def test_resume_true_with_checkpoints_but_none_valid_is_an_error_naming_them(tmp_path):
    mgr = RunCheckpoints(tmp_path / "ck", keep_last=None)
    assert mgr.resolve(True) is None  # nothing there at all: a fresh start
    mgr.root.mkdir()
    (mgr.root / ".tmp-step-000004-1").mkdir()  # an interrupted first save is not a checkpoint
    assert mgr.resolve(True) is None
    (mgr.root / "step-000005").mkdir()  # e.g. copied without its marker
    with pytest.raises(CheckpointError, match="step-000005: .*no COMMITTED marker"):
        mgr.resolve(True)
    saved = _save(mgr, 6)
    (saved / "MANIFEST.hmac").unlink()
    with pytest.raises(CheckpointError) as err:
        mgr.resolve(True)
    assert "step-000006: " in str(err.value) and "MANIFEST.hmac" in str(err.value)
    assert "step-000005: " in str(err.value)
    with pytest.raises(CheckpointError, match="MANIFEST.hmac"):
        mgr.resolve(str(saved))


def test_key_file_option_signs_with_that_key(tmp_path):
    mine = RunCheckpoints(tmp_path / "ck", key_file=tmp_path / "mine.key")
    saved = _save(mine, 1)
    assert mine.latest() == saved
    load_key(tmp_path / "theirs.key")  # another key that exists (a missing one is an error)
    theirs = RunCheckpoints(tmp_path / "ck", key_file=tmp_path / "theirs.key")
    assert theirs.latest() is None
    assert "fails its HMAC check" in theirs.skipped[0][1]
    assert str(tmp_path / "theirs.key") in theirs.skipped[0][1]


def test_a_missing_key_where_signed_checkpoints_exist_is_an_error_not_a_new_key(tmp_path):
    _save(RunCheckpoints(tmp_path / "ck", key_file=tmp_path / "mine.key"), 1)
    lost = RunCheckpoints(tmp_path / "ck", key_file=tmp_path / "lost.key")
    assert lost.latest() is None
    reason = lost.skipped[0][1]
    assert str(tmp_path / "lost.key") in reason and "step" in reason and "does not exist" in reason
    assert not (tmp_path / "lost.key").exists()
    with pytest.raises(CheckpointError, match="lost.key does not exist, but .*ck"):
        _save(lost, 2)
    assert not (tmp_path / "lost.key").exists()


@pytest.mark.parametrize("where", ["world_writable", "checkpoint_root", "checkout"])
def test_a_key_in_an_unsafe_place_is_refused(tmp_path, monkeypatch, where):
    if where == "world_writable":
        shared = tmp_path / "shared"
        shared.mkdir()
        shared.chmod(0o777)
        key, match = shared / "k.key", "writable by every user"
    elif where == "checkpoint_root":
        key, match = tmp_path / "ck" / "k.key", "inside the checkpoint root"
    else:
        checkout = tmp_path / "repo"
        (checkout / ".git").mkdir(parents=True)
        (checkout / "pyproject.toml").write_text("[project]\n")
        monkeypatch.chdir(checkout)
        key, match = checkout / "keys" / "k.key", "inside the checkout"
    with pytest.raises(CheckpointError, match=match):
        _save(RunCheckpoints(tmp_path / "ck", key_file=key), 1)
    assert not key.exists()


def test_every_file_fsynced_before_marker_and_prune_after_durable(tmp_path, monkeypatch):
    import rl_train.checkpoint_store as rc

    mgr = RunCheckpoints(tmp_path, keep_last=1)
    _save(mgr, 1)
    events = []
    real_fsync, real_rmtree = os.fsync, rc.shutil.rmtree

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def rmtree(path, *a, **kw):
        events.append(("rmtree", str(path)))
        return real_rmtree(path, *a, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(rc.shutil, "rmtree", rmtree)
    final = _save(mgr, 2)
    synced = [p for kind, p in events if kind == "fsync"]
    tmp = next(p for p in synced if p.endswith("/COMMITTED"))
    tmp_dir = tmp.rsplit("/", 1)[0]
    marker_at = synced.index(tmp)
    for rel in ("actor_train/shard.bin", "actor_train", "run_state.json", "MANIFEST.json"):
        assert f"{tmp_dir}/{rel}" in synced[:marker_at], rel
    prune_at = events.index(("rmtree", str(mgr.step_dir(1))))
    assert ("fsync", str(tmp_path)) in events[:prune_at]
    assert mgr.complete() == [final]


def test_worker_processes_seed_every_rng_stream():
    """Two fresh worker processes with the same seed draw the same torch, python and numpy
    numbers (python's and numpy's streams used to start from OS entropy)."""
    import subprocess
    import sys

    code = (
        "import random, numpy as np, torch\n"
        "from rl_runtime.cluster.worker_process import _init_process\n"
        "_init_process({}, 5)\n"
        "print(random.random(), float(np.random.rand()), float(torch.rand(1)))\n"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
        ).stdout
        for _ in range(2)
    }
    assert len(outs) == 1, outs


@pytest.mark.timeout(60)  # a FIFO read without O_NONBLOCK would block here
@pytest.mark.parametrize("form", MALFORMED_SIGNATURES)
def test_malformed_signature_of_a_newer_checkpoint_resumes_from_the_older(tmp_path, form):
    mgr = RunCheckpoints(tmp_path, keep_last=None)
    older, newer = _save(mgr, 1), _save(mgr, 2)
    plant_malformed_signature(newer, form)
    assert mgr.resolve(True) == older
    [(skipped, why)] = mgr.skipped
    assert skipped == newer and f"{newer}: " in why and "MANIFEST.hmac" in why


def test_renamed_signed_checkpoint_is_refused_and_never_prunes_the_real_ones(tmp_path):
    mgr = RunCheckpoints(tmp_path, keep_last=2)
    for step in (1, 2):
        _save(mgr, step)
    shutil.copytree(mgr.step_dir(1), mgr.step_dir(9999))  # a replay, "newest" by name
    assert mgr.resolve(True) == mgr.step_dir(2)
    [(_, why)] = mgr.skipped
    assert "signed for step 1, but the directory is step 9999" in why
    _save(mgr, 3)
    assert [p.name for p in mgr.complete()] == ["step-000002", "step-000003", "step-009999"]
    assert mgr.resolve(True) == mgr.step_dir(3)


def test_checkpoint_of_another_run_or_a_symlink_is_not_taken_as_newest(tmp_path):
    other = RunCheckpoints(tmp_path / "other_run", keep_last=None)
    mgr = RunCheckpoints(tmp_path / "ck", keep_last=None)
    _save(mgr, 1)
    shutil.copytree(_save(other, 4), mgr.step_dir(5))
    mgr.step_dir(6).symlink_to(_save(other, 6), target_is_directory=True)
    assert mgr.resolve(True) == mgr.step_dir(1)
    reasons = dict(mgr.skipped)
    assert "is a symlink" in reasons[mgr.step_dir(6)]
    assert "signed for step 4" in reasons[mgr.step_dir(5)]


def test_step_names_other_than_ascii_digits_are_no_checkpoints(tmp_path):
    mgr = RunCheckpoints(tmp_path, keep_last=None)
    saved = _save(mgr, 1)
    for name in ("step-0_9999", "step-+9999", "step-\u0669\u0669"):  # int() takes all three
        shutil.copytree(saved, tmp_path / name)
    assert mgr.present() == [saved]


FULL_DISK_SCRIPT = """
import json, sys
from pathlib import Path
import torch
from rl_runtime.state.checkpoint import RunCheckpoints, CheckpointSpaceError, RunState
root, key = Path(sys.argv[1]), sys.argv[2]
mgr = RunCheckpoints(root / "ck", keep_last=None, key_file=key)
small = lambda d: torch.save(torch.zeros(16), d / "model.pt")
big = lambda d: torch.save(torch.zeros(1 << 20), d / "model.pt")  # 4 MiB on a 2 MiB disk
first = mgr.save_run(RunState(1, 1, 1), small)
try:
    mgr.save_run(RunState(2, 2, 2), big)
    error = None
except CheckpointSpaceError as exc:
    error = [exc.errno, str(exc)]
print(json.dumps({"error": error, "left": sorted(p.name for p in (root / "ck").iterdir()),
                  "latest": str(mgr.latest()), "first": str(first)}))
"""


def _check_full_disk_report(report: dict) -> None:
    import errno

    assert report["error"] is not None, report
    code, message = report["error"]
    assert code == errno.ENOSPC and "no space left" in message and "step 2" in message
    assert report["left"] == [os.path.basename(report["first"])]  # no .tmp- directory
    assert report["latest"] == report["first"]  # the previous checkpoint verifies


def test_a_full_disk_during_a_save_says_so_and_keeps_the_last_checkpoint(tmp_path):
    """On a real 2 MiB tmpfs (a private mount namespace): torch's writer fails with
    "unexpected pos", which is reported as ENOSPC; the partial directory is removed."""
    import subprocess
    import sys

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("mounting a small tmpfs needs root and unshare")
    disk, keys = tmp_path / "disk", tmp_path / "keys"
    disk.mkdir()
    keys.mkdir()
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK_SCRIPT)
    command = (f"mount -t tmpfs -o size=2m tmpfs {disk} && "
               f"{sys.executable} {script} {disk} {keys / 'k.key'}")  # fmt: skip
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", command],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    if proc.returncode != 0 and "mount" in proc.stderr and "permission" in proc.stderr.lower():
        pytest.skip(f"no tmpfs mount here: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_full_disk_report(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_enospc_at_the_write_layer_is_reported_and_cleaned_up(tmp_path, monkeypatch):
    """Anywhere (no mount needed): the file write of the save fails with ENOSPC."""
    import errno

    from rl_runtime.state.checkpoint import CheckpointSpaceError

    mgr = RunCheckpoints(tmp_path / "ck", keep_last=None)
    first = _save(mgr, 1)

    def full(directory):
        (directory / "model.bin").write_bytes(b"x" * 10)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointSpaceError) as caught:
        mgr.save_run(RunState(2, 2, 2), full)
    report = {"error": [caught.value.errno, str(caught.value)], "first": str(first),
              "left": sorted(p.name for p in (tmp_path / "ck").iterdir()),
              "latest": str(mgr.latest())}  # fmt: skip
    _check_full_disk_report(report)
