"""Sandbox uids are claimed host-wide: no two live call slots share one, in one pool or across
pools and processes, and a dead slot's uid is free again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rl_envs.sandbox import SandboxLimits, SandboxPool
from rl_envs.sandbox.uids import claim_uid


def test_claims_skip_held_uids_and_release_on_close(tmp_path):
    locks = tmp_path / "locks"
    a, fd_a = claim_uid(70000, 0, span=4, lock_dir=locks)
    b, fd_b = claim_uid(70000, 0, span=4, lock_dir=locks)
    c, fd_c = claim_uid(70000, 3, span=4, lock_dir=locks)
    assert (a, b, c) == (70000, 70001, 70003)  # slot 3 starts at base + 3
    d, fd_d = claim_uid(70000, 3, span=4, lock_dir=locks)
    assert d == 70002  # wraps around within the span
    with pytest.raises(RuntimeError, match="all 4 sandbox uids from 70000 are claimed"):
        claim_uid(70000, 0, span=4, lock_dir=locks)
    os.close(fd_b)
    again, fd = claim_uid(70000, 0, span=4, lock_dir=locks)
    assert again == 70001
    for f in (fd_a, fd_c, fd_d, fd):
        os.close(f)


def test_a_claim_held_by_another_process_is_skipped_and_freed_when_it_dies(tmp_path):
    locks = tmp_path / "locks"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from rl_envs.sandbox.uids import claim_uid\n"
            f"uid, fd = claim_uid(71000, 0, span=8, lock_dir=Path({str(locks)!r}))\n"
            "print(uid, flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "71000"
        uid, fd = claim_uid(71000, 0, span=8, lock_dir=locks)
        assert uid == 71001
        os.close(fd)
    finally:
        holder.kill()
        holder.wait()
    uid, fd = claim_uid(71000, 0, span=8, lock_dir=locks)  # the killed holder let go
    assert uid == 71000
    os.close(fd)


def test_a_lock_dir_others_can_write_or_a_symlink_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PermissionError, match="writable by nobody else"):
        claim_uid(72000, lock_dir=shared)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(PermissionError, match="must be a real directory"):
        claim_uid(72000, lock_dir=link)


@pytest.mark.skipif(os.geteuid() != 0, reason="per-slot uids only when the pool runs as root")
def test_two_pools_on_one_host_never_share_a_slot_uid():
    limits = SandboxLimits(allow_weak_isolation=True)
    with SandboxPool(2, limits=limits) as first, SandboxPool(2, limits=limits) as second:
        uids = [
            first.call_source("import os\ndef f():\n    return os.getuid()\n", "f", []).value
            for _ in range(4)
        ]
        uids += [
            second.call_source("import os\ndef f():\n    return os.getuid()\n", "f", []).value
            for _ in range(4)
        ]
        claimed = {w["isolation"]["sandbox_uid"] for p in (first, second) for w in p.workers_info}
    assert len(claimed) == 4  # four live slots, four uids
    assert set(uids) <= claimed
