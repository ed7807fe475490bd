"""Rendezvous stores without a port race: a listener held from the moment its port is published,
and a node-local FileStore that needs no port at all. Real sockets, real gloo processes."""

import contextlib
import errno
import os
import queue
import socket
import stat
import time

import pytest

from rl_sync.group import free_port
from rl_sync.store import (
    bind_listener,
    create_private_file,
    create_store,
    host_tag,
    loopback_interface,
    loopback_socket_env,
    new_rendezvous_token,
    node_local_store,
    node_local_store_path,
    remove_node_local_store,
    sweep_leaked_rendezvous,
)
from rl_sync.testing import killed_launchers_store, mp_context, store_rank_main

pytestmark = pytest.mark.xdist_group("dist")


def _squat(port: int) -> socket.socket:
    """Another process's socket on ``port`` (as Ray's connections take ephemeral ports)."""
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    return squatter


def test_a_port_only_found_free_can_be_taken_before_the_store_binds_it():
    port = free_port()
    with _squat(port), pytest.raises(OSError) as err:
        create_store("127.0.0.1", port, 2, True, 10)
    assert err.value.errno == errno.EADDRINUSE


def test_a_held_listener_keeps_its_port_until_the_store_takes_it_over():
    listener = bind_listener("127.0.0.1", 0)
    port = int(listener.getsockname()[1])
    with pytest.raises(OSError) as err:  # published but not yet served: nobody else gets it
        _squat(port)
    assert err.value.errno == errno.EADDRINUSE
    server = create_store("127.0.0.1", port, 2, True, 10, listener=listener)
    client = create_store("127.0.0.1", port, 2, False, 10)
    client.set("from_client", b"hello")
    assert int(server.port) == port
    assert server.get("from_client") == b"hello"


def test_listener_is_refused_where_it_cannot_be_used():
    listener = bind_listener("127.0.0.1", 0)
    with listener, pytest.raises(ValueError, match="only the store's server"):
        create_store("127.0.0.1", listener.getsockname()[1], 2, False, 10, listener=listener)
    listener = bind_listener("127.0.0.1", 0)
    other = int(listener.getsockname()[1]) + 1
    with pytest.raises(ValueError, match=f"not the requested {other}"):
        create_store("127.0.0.1", other, 2, True, 10, listener=listener)


def test_node_local_store_forms_a_two_rank_gloo_group_in_a_private_file_the_launcher_removes():
    token = new_rendezvous_token()
    ctx = mp_context()
    results = ctx.Queue()
    ranks = [
        ctx.Process(target=store_rank_main, args=(r, 2, token, results), daemon=True)
        for r in range(2)
    ]
    for p in ranks:
        p.start()
    got = sorted(_reports(results, ranks))
    for p in ranks:
        p.join(timeout=HANG_S)
    assert [p.exitcode for p in ranks] == [0, 0]
    # the ranks ran under umask 022; FileStore alone would have made the file 0644
    assert got == [("ok", 0, 3.0, 0o600), ("ok", 1, 3.0, 0o600)], got
    # the launcher's part: the file may or may not have gone with the ranks' stores (their
    # removal races); after remove_node_local_store it is gone, and a second call finds none
    remove_node_local_store(token)
    assert not node_local_store_path(token).exists()
    assert remove_node_local_store(token) is False


HANG_S = 300.0
"""Bounds only a hang: two fresh interpreters importing torch and forming a gloo group take
10-20 s of CPU each, over a minute on 2 loaded cores."""


def _reports(results, ranks) -> list:
    """One report per rank from ``results``, waiting while a rank that has not reported lives:
    a rank that died without reporting fails at once, a hang after `HANG_S`."""
    got: list = []
    deadline = time.monotonic() + HANG_S
    while len(got) < len(ranks):
        waiting = sum(p.is_alive() for p in ranks) >= len(ranks) - len(got)
        try:  # a rank that exited may have left its report in the pipe: look once more
            got.append(results.get(timeout=1.0 if waiting else 10.0))
            continue
        except queue.Empty:
            pass
        assert waiting, f"a rank exited without reporting: {got}"
        assert time.monotonic() < deadline, f"no report within {HANG_S:g} s: {got}"
    return got


def test_a_single_rank_store_is_in_memory_and_makes_no_file():
    one, two = new_rendezvous_token(), new_rendezvous_token()
    store = node_local_store(one, 1)
    store.set("key", "value")
    assert store.get("key") == b"value"
    assert not node_local_store_path(one).exists()
    shared = node_local_store(two, 2)  # more ranks: the file they meet in
    try:
        shared.set("key", "value")
        assert node_local_store_path(two).exists()
    finally:
        node_local_store_path(two).unlink(missing_ok=True)


@pytest.mark.parametrize("token", ["short", "../../../etc/passwd-0123456789", "a" * 65, ""])
def test_node_local_store_refuses_a_token_that_could_name_another_file(token):
    with pytest.raises(ValueError, match="rendezvous token"):
        node_local_store(token, 1)


def test_rendezvous_tokens_are_fresh_and_valid():
    tokens = {new_rendezvous_token() for _ in range(100)}
    assert len(tokens) == 100
    for t in tokens:
        assert node_local_store_path(t).name == f"rl-rendezvous-{t}"
        pid, tag, rest = t.split("-")  # the maker, its host, 128 random bits
        assert (int(pid), tag, len(rest)) == (os.getpid(), host_tag(), 32)


def test_a_killed_launchers_store_file_is_swept_and_nothing_else(tmp_path):
    leaked = killed_launchers_store(tmp_path)
    dead_pid = leaked.split("-")[2]
    ours = f"rl-rendezvous-{new_rendezvous_token()}"  # this process: alive
    create_private_file(tmp_path / ours)
    hex32 = "0" * 32
    init = f"rl-rendezvous-1-{host_tag()}-{hex32}"  # a live pid, of another process
    elsewhere = f"rl-rendezvous-{dead_pid}-{'f' * 8}-{hex32}"  # another host's launcher
    older = f"rl-rendezvous-{hex32}"  # a token without a pid
    link = f"rl-rendezvous-{dead_pid}-{host_tag()}-{'1' * 32}"  # a symlink: not followed
    directory = f"rl-rendezvous-{dead_pid}-{host_tag()}-{'2' * 32}"
    for name in (init, elsewhere, older):
        create_private_file(tmp_path / name)
    (tmp_path / "victim").write_text("keep me")
    (tmp_path / link).symlink_to(tmp_path / "victim")
    (tmp_path / directory).mkdir()

    assert sweep_leaked_rendezvous(tmp_path) == [tmp_path / leaked]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [ours, init, elsewhere, older, link, directory, "victim"]
    )
    assert (tmp_path / "victim").read_text() == "keep me"
    assert sweep_leaked_rendezvous(tmp_path) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's file needs root")
def test_another_users_leaked_store_file_is_left_alone(tmp_path):
    leaked = killed_launchers_store(tmp_path)
    os.chown(tmp_path / leaked, 65534, 65534)  # nobody's
    assert sweep_leaked_rendezvous(tmp_path) == []
    assert (tmp_path / leaked).is_file()


def test_the_store_file_is_private_and_one_planted_under_its_name_is_refused(tmp_path):
    old_umask = os.umask(0o022)
    try:
        create_private_file(tmp_path / "store")
        create_private_file(tmp_path / "store")  # another rank of the group: uses it
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(tmp_path / "store").st_mode) == 0o600
    (tmp_path / "readable").touch(mode=0o644)
    (tmp_path / "link").symlink_to(tmp_path / "store")
    for name in ("readable", "link"):
        with pytest.raises(PermissionError, match=f"{name} exists but is not a private regular"):
            create_private_file(tmp_path / name)
    assert (tmp_path / "store").read_bytes() == b""


@pytest.mark.parametrize(
    ("backend", "environ", "expected"),
    [
        ("gloo", {}, {"GLOO_SOCKET_IFNAME": "lo"}),  # an exact interface name
        ("nccl", {}, {"NCCL_SOCKET_IFNAME": "=lo"}),  # "=": exactly lo, not a prefix
        ("hccl", {}, {"HCCL_SOCKET_IFNAME": "=lo"}),
        ("gloo", {"GLOO_SOCKET_IFNAME": "eth0"}, {}),  # the user chose: left alone
        ("nccl", {"NCCL_SOCKET_IFNAME": "ib"}, {}),
        ("nccl", {"GLOO_SOCKET_IFNAME": "eth0"}, {"NCCL_SOCKET_IFNAME": "=lo"}),  # not nccl's
        ("hccl", {"HCCL_SOCKET_IFNAME": "eth"}, {}),
        ("hccl", {"HCCL_IF_IP": "10.0.0.7"}, {}),  # takes precedence over HCCL_SOCKET_IFNAME
        ("hccl", {"NCCL_SOCKET_IFNAME": "ib"}, {"HCCL_SOCKET_IFNAME": "=lo"}),
        ("mpi", {}, {}),  # a backend it does not know
    ],
)
def test_loopback_socket_env_names_the_backends_own_variable_unless_the_user_set_it(
    backend, environ, expected
):
    assert loopback_socket_env(backend, environ, interface="lo") == expected


def test_loopback_socket_env_reads_the_machines_loopback_and_the_process_env(monkeypatch):
    lo = loopback_interface()
    assert lo is not None  # Linux: "lo"
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    assert loopback_socket_env("nccl") == {"NCCL_SOCKET_IFNAME": f"={lo}"}
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    assert loopback_socket_env("nccl") == {}
    monkeypatch.setattr("rl_sync.store.loopback_interface", lambda: None)
    assert loopback_socket_env("gloo", {}) == {}  # no loopback interface known: nothing


@pytest.mark.parametrize(
    ("host", "preset", "expected"),
    [
        ("127.0.0.1", None, "={lo}"),
        ("localhost", None, "={lo}"),
        ("10.0.0.7", None, None),  # a cluster address: the ranks may be on other nodes
        ("127.0.0.1", "ib0", "ib0"),  # the user's choice stays
    ],
)
def test_a_loopback_weight_sync_group_pins_nccl_to_loopback(monkeypatch, host, preset, expected):
    """The trainer -> rollout broadcast group over NCCL (formed on a GPU only: here the
    communicator's constructor refuses, after the environment is set)."""
    from datetime import timedelta

    from torch._C._distributed_c10d import HashStore

    from rl_sync import group

    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    if preset is not None:
        monkeypatch.setenv("NCCL_SOCKET_IFNAME", preset)
    with contextlib.suppress(ValueError, RuntimeError):  # no GPU here
        group._make_backend("nccl", HashStore(), 0, 1, timedelta(seconds=5), host)
    lo = loopback_interface()
    assert os.environ.get("NCCL_SOCKET_IFNAME") == (expected and expected.format(lo=lo))
