"""`rl_train.dist.spawn` and rl-runtime's worker groups meet in a node-local store: no port is
picked ahead of time, so none can be taken before rank 0 binds it."""

import json
import os
import re

import pytest
import torch.distributed

from rl_sync.store import loopback_interface, node_local_store_path
from rl_train import dist as rdist
from rl_train.dist import spawn
from rl_train.testing import rendezvous_probe, stalled_rank

pytestmark = pytest.mark.xdist_group("dist")


#: these ranks take seconds; a hang shows the stuck ranks' stacks long before pytest-timeout fires
SPAWN_TIMEOUT_S = 180.0


def test_spawned_ranks_meet_without_a_port_and_leave_no_store_file(tmp_path):
    spawn(rendezvous_probe, 2, str(tmp_path), timeout_s=SPAWN_TIMEOUT_S)
    seen = [json.loads((tmp_path / f"probe_rank{r}.json").read_text()) for r in range(2)]
    assert [s["sum"] for s in seen] == [3.0, 3.0]  # 1 + 2: both ranks took part
    assert [s["world"] for s in seen] == [2, 2]
    assert seen[0]["master_port"] is None and seen[1]["master_port"] is None
    token = seen[0]["token"]
    assert token and seen[1]["token"] == token
    assert seen[0]["store_file"]  # the ranks met in the node-local file ...
    assert not node_local_store_path(token).exists()  # ... and it is gone after them
    lo = os.environ.get("GLOO_SOCKET_IFNAME", loopback_interface())  # one the user set stays
    assert lo is not None  # this machine has a loopback interface
    for s in seen:  # the gloo group's pairs listen on loopback; no other backend's var is set
        assert s["socket_env"] == {
            "GLOO_SOCKET_IFNAME": lo,
            "NCCL_SOCKET_IFNAME": os.environ.get("NCCL_SOCKET_IFNAME"),
            "HCCL_SOCKET_IFNAME": os.environ.get("HCCL_SOCKET_IFNAME"),
        }


def test_a_single_rank_makes_no_store_file(tmp_path):
    """A group of one meets no one: no file, so none is left if the rank is killed."""
    spawn(rendezvous_probe, 1, str(tmp_path), timeout_s=SPAWN_TIMEOUT_S)
    seen = json.loads((tmp_path / "probe_rank0.json").read_text())
    assert seen["sum"] == 1.0 and seen["world"] == 1
    assert seen["token"] and not seen["store_file"]


def test_a_second_spawn_gets_a_fresh_rendezvous(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    spawn(rendezvous_probe, 2, str(first), timeout_s=SPAWN_TIMEOUT_S)
    spawn(rendezvous_probe, 2, str(second), timeout_s=SPAWN_TIMEOUT_S)
    tokens = {json.loads((d / "probe_rank0.json").read_text())["token"] for d in (first, second)}
    assert len(tokens) == 2


def test_a_rank_that_overruns_the_timeout_shows_its_stack_and_is_killed(tmp_path, capfd):
    """Rank 1 never returns: spawn names it, after its threads' stacks were written to stderr,
    and leaves no process behind. (A rank still importing torch at the deadline cannot dump its
    stack yet: on a loaded machine the deadline is raised once.)"""
    import multiprocessing

    ready = tmp_path / "ready"
    for timeout_s in (20.0, 90.0):
        with pytest.raises(TimeoutError) as raised:
            spawn(stalled_rank, 2, 1, str(ready), timeout_s=timeout_s)
        if ready.exists():
            break
    assert ready.exists(), "rank 1 never reached stalled_rank"
    assert re.search(r"rank\(s\) \[(0, )?1\] still running after \d+ s", str(raised.value))
    assert "in stalled_rank" in capfd.readouterr().err  # rank 1's frame, from its stack dump
    assert multiprocessing.active_children() == []


SOCKET_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME", "HCCL_IF_IP")


@pytest.mark.parametrize(
    ("backend", "rendezvous", "user_set", "expected"),
    [
        ("nccl", {"RL_RENDEZVOUS_TOKEN": "a" * 32}, {}, {"NCCL_SOCKET_IFNAME": "={lo}"}),
        ("hccl", {"RL_RENDEZVOUS_TOKEN": "a" * 32}, {}, {"HCCL_SOCKET_IFNAME": "={lo}"}),
        ("nccl", {"MASTER_ADDR": "127.0.0.1"}, {}, {"NCCL_SOCKET_IFNAME": "={lo}"}),
        ("nccl", {"MASTER_ADDR": "10.0.0.7"}, {}, {}),  # a cluster address: left to NCCL
        ("hccl", {"MASTER_ADDR": "10.0.0.7"}, {}, {}),
        ("nccl", {"RL_RENDEZVOUS_TOKEN": "a" * 32}, {"NCCL_SOCKET_IFNAME": "ib0"}, {}),
        ("hccl", {"RL_RENDEZVOUS_TOKEN": "a" * 32}, {"HCCL_IF_IP": "10.0.0.7"}, {}),
    ],
)
def test_a_single_node_nccl_or_hccl_group_is_pinned_to_loopback_unless_the_user_chose(
    monkeypatch, backend, rendezvous, user_set, expected
):
    """What `init_distributed` has set when it forms the group (the group itself is recorded,
    not formed: no GPU or NPU here); a variable the user set is never changed."""
    for name in (*SOCKET_VARS, "RL_RENDEZVOUS_TOKEN", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "1", **rendezvous, **user_set}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    seen: list[dict[str, str]] = []

    def init_process_group(**kwargs: object) -> None:
        seen.append({name: os.environ[name] for name in SOCKET_VARS if name in os.environ})

    # a group another test left in this process would make init_distributed a no-op
    monkeypatch.setattr(rdist, "is_dist", lambda: False)
    monkeypatch.setattr(rdist, "backend_for", lambda kind: backend)
    monkeypatch.setattr(rdist, "create_store", lambda *a: object())
    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    rdist.init_distributed("cpu")
    lo = loopback_interface()
    assert seen == [{**user_set, **{k: v.format(lo=lo) for k, v in expected.items()}}]
