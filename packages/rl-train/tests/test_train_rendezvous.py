"""`rl_train.dist.spawn` and rl-runtime's worker groups meet in a node-local store: no port is
picked ahead of time, so none can be taken before rank 0 binds it."""

import json

import pytest

from rl_sync.store import node_local_store_path
from rl_train.dist import spawn
from rl_train.testing import rendezvous_probe

pytestmark = pytest.mark.xdist_group("dist")


def test_spawned_ranks_meet_without_a_port_and_leave_no_store_file(tmp_path):
    spawn(rendezvous_probe, 2, str(tmp_path))
    seen = [json.loads((tmp_path / f"probe_rank{r}.json").read_text()) for r in range(2)]
    assert [s["sum"] for s in seen] == [3.0, 3.0]  # 1 + 2: both ranks took part
    assert [s["world"] for s in seen] == [2, 2]
    assert seen[0]["master_port"] is None and seen[1]["master_port"] is None
    token = seen[0]["token"]
    assert token and seen[1]["token"] == token
    assert seen[0]["store_file"]  # the ranks met in the node-local file ...
    assert not node_local_store_path(token).exists()  # ... and it is gone after them


def test_a_single_rank_makes_no_store_file(tmp_path):
    """A group of one meets no one: no file, so none is left if the rank is killed."""
    spawn(rendezvous_probe, 1, str(tmp_path))
    seen = json.loads((tmp_path / "probe_rank0.json").read_text())
    assert seen["sum"] == 1.0 and seen["world"] == 1
    assert seen["token"] and not seen["store_file"]


def test_a_second_spawn_gets_a_fresh_rendezvous(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    spawn(rendezvous_probe, 2, str(first))
    spawn(rendezvous_probe, 2, str(second))
    tokens = {json.loads((d / "probe_rank0.json").read_text())["token"] for d in (first, second)}
    assert len(tokens) == 2
