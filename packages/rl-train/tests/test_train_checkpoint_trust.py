"""A checkpoint is loaded only if this project can vouch for it: a crafted directory (pickle
payloads in DCP's ``.metadata``, in a DCP byte item, in the RNG file) runs nothing and is refused
naming the file; the manifest's HMAC key lives outside the directory; every file is fsynced before
the commit marker and older checkpoints are pruned only after the new one is durable."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
import time
from pathlib import Path

import pytest
import torch

import rl_train
from rl_train import checkpoint as ckpt
from rl_train import signing
from rl_train.testing import make_batch, nll_loss


class _Payload:
    """Unpickling this runs ``touch <sentinel>``: what an attacker puts into a checkpoint."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self):
        return (os.system, (f"touch {self.sentinel}",))


def _backend(path):
    return rl_train.build_backend(
        "hf_infer",
        role="actor",
        model_path=path,
        training_args=dict(per_device_train_batch_size=2, gradient_accumulation_steps=2),
    )


@pytest.fixture(scope="module")
def trained(tiny_model_path):
    backend = _backend(tiny_model_path)
    backend.train_step(make_batch(4, 10, seed=1), nll_loss)
    return backend


def _forge_manifest(ckpt_dir: Path) -> None:
    """What an attacker who can write the directory does: a manifest with correct hashes."""
    files = {}
    for p in sorted(ckpt_dir.rglob("*")):
        rel = p.relative_to(ckpt_dir).as_posix()
        if p.is_file() and rel not in ("MANIFEST.json", "MANIFEST.hmac", "COMMITTED"):
            files[rel] = {
                "bytes": p.stat().st_size,
                "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
            }
    (ckpt_dir / "MANIFEST.json").write_text(json.dumps({"format": 1, "step": 1, "files": files}))


def _craft_metadata(ckpt_dir: Path, sentinel: Path) -> tuple[str, ...]:
    (ckpt_dir / "model_optim" / ".metadata").write_bytes(pickle.dumps(_Payload(sentinel)))
    return ("model_optim/.metadata",)


def _craft_byte_item(ckpt_dir: Path, sentinel: Path) -> tuple[str, ...]:
    """A consistent DCP checkpoint whose optimizer byte item (an lr) unpickles the payload."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    meta = FileSystemReader(str(ckpt_dir / "model_optim")).read_metadata()
    sd = {}
    for fqn, item in meta.state_dict_metadata.items():
        if hasattr(item, "chunks"):
            sd[fqn] = torch.zeros(item.size, dtype=item.properties.dtype)
        else:
            sd[fqn] = _Payload(sentinel) if fqn.endswith(".lr") else 0.9
    for p in (ckpt_dir / "model_optim").iterdir():
        p.unlink()
    dcp.save(sd, checkpoint_id=str(ckpt_dir / "model_optim"), no_dist=True)
    shards = [p.relative_to(ckpt_dir).as_posix() for p in ckpt_dir.rglob("*.distcp")]
    return ("model_optim/.metadata", *shards)


def _craft_rng(ckpt_dir: Path, sentinel: Path) -> tuple[str, ...]:
    torch.save({"torch": _Payload(sentinel)}, ckpt_dir / "rng_rank0.pt")
    return ("rng_rank0.pt",)


CRAFTS = {"metadata": _craft_metadata, "byte_item": _craft_byte_item, "rng": _craft_rng}


@pytest.mark.parametrize("forge_manifest", [False, True], ids=["stale_manifest", "forged"])
@pytest.mark.parametrize("craft", sorted(CRAFTS))
def test_crafted_checkpoint_runs_nothing_and_is_refused(
    trained, tiny_model_path, tmp_path, craft, forge_manifest
):
    saved = trained.save_checkpoint(tmp_path / "ck", 1)
    sentinel = tmp_path / "PWNED"
    crafted = CRAFTS[craft](saved, sentinel)
    assert not sentinel.exists()
    if forge_manifest:
        _forge_manifest(saved)
    assert ckpt.latest_checkpoint(tmp_path / "ck") is None
    victim = _backend(tiny_model_path)
    with pytest.raises(rl_train.CheckpointError) as err:
        victim.load_checkpoint(tmp_path / "ck")
    assert not sentinel.exists(), "loading a crafted checkpoint executed its payload"
    message = str(err.value)
    assert str(saved) in message
    if forge_manifest:
        assert "MANIFEST.json fails its HMAC check" in message
    else:
        assert any(f"file {rel} " in message for rel in crafted), message


def test_signed_with_another_key_or_unsigned_is_refused(trained, tmp_path, monkeypatch):
    saved = trained.save_checkpoint(tmp_path / "ck", 3, key_file=tmp_path / "a.key")
    ckpt.verify(saved, key_file=tmp_path / "a.key")
    with pytest.raises(rl_train.CheckpointError, match="b.key does not exist, but .*step-000003"):
        ckpt.verify(saved, key_file=tmp_path / "b.key")  # not a silently created new key
    assert not (tmp_path / "b.key").exists()
    signing.load_key(tmp_path / "b.key")
    with pytest.raises(rl_train.CheckpointError, match="MANIFEST.json fails its HMAC check") as e:
        ckpt.verify(saved, key_file=tmp_path / "b.key")
    key_a = signing.load_key(tmp_path / "a.key")
    assert f"signed by key {key_a.key_id}" in str(e.value)
    (saved / "MANIFEST.hmac").unlink()
    with pytest.raises(rl_train.CheckpointError, match="MANIFEST.hmac.*not signed"):
        ckpt.verify(saved, key_file=tmp_path / "a.key")
    # an operator who trusts the directory signs it explicitly; then it loads
    assert signing.main(["trust", str(saved), "--key-file", str(tmp_path / "b.key")]) == 0
    ckpt.verify(saved, key_file=tmp_path / "b.key")


def test_unlisted_file_and_symlink_are_refused(trained, tmp_path):
    saved = trained.save_checkpoint(tmp_path / "ck", 1)
    (saved / "model_optim" / "__9_0.distcp").write_bytes(b"x")
    with pytest.raises(rl_train.CheckpointError, match=r"model_optim/__9_0.distcp is not in"):
        ckpt.verify(saved)
    (saved / "model_optim" / "__9_0.distcp").unlink()
    target = saved / "trainer_state.json"
    moved = tmp_path / "elsewhere.json"
    target.rename(moved)
    target.symlink_to(moved)
    with pytest.raises(rl_train.CheckpointError, match="trainer_state.json is a symlink"):
        ckpt.verify(saved)


def test_key_file_created_private_and_refused_when_not(tmp_path, monkeypatch):
    path = tmp_path / "cfg" / "rl-stack" / "checkpoint.key"
    monkeypatch.delenv(signing.KEY_FILE_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert signing.default_key_file() == path
    key = signing.load_key()
    assert key.path == path and len(key.secret) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert signing.load_key(path).secret == key.secret  # stable across loads
    assert key.secret.hex() not in repr(key)
    monkeypatch.setenv(signing.KEY_FILE_ENV, str(tmp_path / "env.key"))
    assert signing.load_key().path == tmp_path / "env.key"
    path.chmod(0o644)
    with pytest.raises(rl_train.CheckpointError, match=r"accessible by others \(mode 0644\)"):
        signing.load_key(path)
    with pytest.raises(rl_train.CheckpointError, match="does not exist"):
        signing.load_key(tmp_path / "missing.key", create=False)


def test_file_swapped_after_verification_is_not_read(trained, tmp_path):
    saved = trained.save_checkpoint(tmp_path / "ck", 1)
    files = ckpt.verify(saved)
    (saved / "rng_rank0.pt").write_bytes(b"swapped")
    with (
        pytest.raises(rl_train.CheckpointError, match="rng_rank0.pt changed after verification"),
        ckpt.open_verified(saved, saved / "rng_rank0.pt", files),
    ):
        pass


def test_every_file_fsynced_before_marker_and_prune_after_durable(tmp_path, monkeypatch):
    events: list[tuple[str, str]] = []
    real_fsync, real_rmtree = os.fsync, ckpt.shutil.rmtree

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def rmtree(path, *a, **kw):
        events.append(("rmtree", str(path)))
        return real_rmtree(path, *a, **kw)

    root = tmp_path / "ck"
    for step in (1, 2):
        tmp = ckpt.begin(root, step)
        (tmp / "model_optim").mkdir()
        (tmp / "model_optim" / "__0_0.distcp").write_bytes(os.urandom(64))
        (tmp / "trainer_state.json").write_text("{}")
        if step == 2:
            monkeypatch.setattr(os, "fsync", fsync)
            monkeypatch.setattr(ckpt.shutil, "rmtree", rmtree)
        final = ckpt.commit(root, step, tmp, keep_last=1)
    synced = [p for kind, p in events if kind == "fsync"]
    marker_at = synced.index(str(tmp / "COMMITTED"))
    for rel in ("model_optim/__0_0.distcp", "trainer_state.json", "MANIFEST.json"):
        assert str(tmp / rel) in synced[:marker_at], rel
    for d in (tmp / "model_optim", tmp):
        assert str(d) in synced[:marker_at], d
    assert synced[marker_at + 1 :].count(str(root)) >= 1  # the rename is durable
    prune_at = events.index(("rmtree", str(root / "step-000001")))
    root_synced_at = max(i for i, e in enumerate(events) if e == ("fsync", str(root)))
    assert root_synced_at < prune_at
    assert [p.name for p in ckpt.committed_checkpoints(root)] == [final.name]


def test_verification_cost_is_reported(trained, tmp_path, capsys):
    """Measured, not asserted tight: HMAC + sha256 of the tiny checkpoint."""
    saved = trained.save_checkpoint(tmp_path / "ck", 1)
    size = sum(p.stat().st_size for p in saved.rglob("*") if p.is_file())
    t0 = time.perf_counter()
    for _ in range(5):
        ckpt.verify(saved)
    per = (time.perf_counter() - t0) / 5
    with capsys.disabled():
        print(f"\nverify (HMAC + sha256) of {size / 1e6:.2f} MB checkpoint: {per * 1e3:.2f} ms")
    assert per < 5.0


def test_concurrent_first_use_agrees_on_one_complete_key(tmp_path):
    """Processes racing to create the key all read the same complete key."""
    import subprocess
    import sys

    path = tmp_path / "race" / "checkpoint.key"
    code = f"from rl_train.signing import load_key; print(load_key({str(path)!r}).key_id)"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    ids = {p.communicate(timeout=300)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(ids) == 1 and ids != {""}
    assert [p.name for p in path.parent.iterdir()] == ["checkpoint.key"]
