"""Colocated (IPC) weight updates: shared memory on CPU; device transports by decision logic."""

import contextlib
import dataclasses
import os

import pytest
import torch

from rl_sync.group import init_group
from rl_sync.ipc import IpcHandle, IpcReceiver, IpcSender, ipc_transport
from rl_sync.testing import bitwise_equal, ipc_receiver_main, make_named_tensors, mp_context, spawn
from rl_sync.transfer import ChecksumError, SyncError, VersionError


def test_transport_follows_the_device_kind():
    assert ipc_transport("cpu") == "shm_file"
    assert ipc_transport("cuda") == "cuda_ipc"
    assert ipc_transport("npu") == "npu_ipc"
    with pytest.raises(ValueError, match="'tpu'"):
        ipc_transport("tpu")  # type: ignore[arg-type]


def _collect(into):
    def apply(named):
        into.clear()
        into.update((name, t.clone()) for name, t in named)

    return apply


def test_roundtrip_through_json_handle_and_buffer_reuse():
    sender, receiver = IpcSender("cpu"), IpcReceiver()
    try:
        first = make_named_tensors(0)
        handle = IpcHandle.from_bytes(sender.export(first, 1).to_bytes())
        got = {}
        receiver.receive(handle, _collect(got))
        assert all(bitwise_equal(got[name], t) for name, t in first)
        second = make_named_tensors(1)
        handle2 = sender.export(second, 2)
        assert handle2.location == handle.location  # same buffer, mapped once
        receiver.receive(handle2, _collect(got))
        assert all(bitwise_equal(got[name], t) for name, t in second)
        assert receiver.last_version == 2
        old_path = handle.location["path"]
        handle3 = sender.export(make_named_tensors(2, scale=8), 3)  # larger: new buffer
        assert handle3.location["path"] != old_path and not os.path.exists(old_path)
        receiver.receive(handle3, _collect(got))
        assert got["model.embed_tokens.weight"].shape == (512, 32)
    finally:
        sender.close()


def test_tampered_buffer_and_stale_version_apply_nothing():
    sender, receiver = IpcSender("cpu"), IpcReceiver(last_version=4)
    try:
        handle = sender.export(make_named_tensors(0), 5)
        path, size = handle.location["path"], handle.location["size"]
        other_view = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
        other_view[100] ^= 0x01
        calls = []
        with pytest.raises(ChecksumError, match="version 5.*model.embed_tokens.weight"):
            receiver.receive(handle, calls.append)
        other_view[100] ^= 0x01
        with pytest.raises(VersionError, match="stale IPC version 3"):
            receiver.receive(sender.export(make_named_tensors(0), 3), calls.append)
        with pytest.raises(VersionError, match="9 was expected"):
            receiver.receive(
                sender.export(make_named_tensors(0), 6), calls.append, expected_version=9
            )
        assert calls == [] and receiver.last_version == 4
    finally:
        sender.close()


def test_handle_pointing_outside_shared_memory_is_refused(tmp_path):
    location = {"path": str(tmp_path / "x.buf"), "size": 8}
    handle = IpcHandle(1, "shm_file", location, 8, 0, []).seal()
    with pytest.raises(SyncError, match="outside"):
        IpcReceiver().open(handle)


def test_a_handle_maps_only_an_rl_sync_buffer_file_never_a_link_or_another_file(
    tmp_path, monkeypatch
):
    """Inside the shared-memory directory a handle may still name a file no sender made (a
    secret of this user) or a link planted under a buffer's name: neither is mapped."""
    import uuid

    import rl_sync.ipc as ipc

    monkeypatch.setattr(ipc, "shm_dir", lambda: str(tmp_path))
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"s" * 64)
    link = tmp_path / f"rl_sync_{os.getpid()}_{uuid.uuid4().hex}.buf"
    link.symlink_to(secret)
    for path, why in ((secret, "not an rl_sync buffer name"), (link, "not a regular file")):
        handle = IpcHandle(1, "shm_file", {"path": str(path), "size": 8}, 8, 0, []).seal()
        with pytest.raises(SyncError, match=why):
            IpcReceiver().open(handle)
    missing = tmp_path / f"rl_sync_{os.getpid()}_{uuid.uuid4().hex}.buf"
    with pytest.raises(SyncError, match="missing"):
        location = {"path": str(missing), "size": 8}
        IpcReceiver().open(IpcHandle(1, "shm_file", location, 8, 0, []).seal())


@contextlib.contextmanager
def _receiver_over_a_group(tmp_path, syncs: int):
    """`(group, sender, results)`: rank 0 of a gloo group whose rank 1 is a process running
    `ipc_receiver_main` for `syncs` updates (its reports on `results`)."""
    ctx = mp_context()
    port_queue, results = ctx.Queue(), ctx.Queue()
    receiver = spawn(ipc_receiver_main, port_queue, results, out_dir=str(tmp_path), syncs=syncs)
    sender = IpcSender("cpu")
    try:
        group = init_group("127.0.0.1", 0, 0, 2, timeout_s=30.0, on_port=port_queue.put)
        yield group, sender, results
        group.close()
    finally:
        sender.close()
        receiver.join(timeout=30)
        if receiver.is_alive():
            receiver.kill()


@pytest.mark.xdist_group("dist")
def test_colocated_update_between_processes_over_a_group(tmp_path):
    with _receiver_over_a_group(tmp_path, syncs=2) as (group, sender, results):
        states = {1: make_named_tensors(10), 2: make_named_tensors(11)}
        for version, named in states.items():
            metrics = sender.send_over(group, named, version)
            assert metrics.version == version and metrics.num_tensors == len(named)
            reply = results.get(timeout=60)
            assert reply == ("ok", version), reply
            got = torch.load(tmp_path / f"v{version}.pt", weights_only=True)
            assert all(bitwise_equal(got[name], t) for name, t in named)


def _adopt(into):
    """An engine's apply in adopt mode: keep the handed views as the weights (no copy)."""

    def apply(named):
        into.clear()
        into.update(named)

    return apply


def test_adopted_views_are_bitwise_equal_and_survive_the_next_export():
    sender, receiver = IpcSender("cpu", num_buffers=2), IpcReceiver(adopt=True)
    try:
        first, second, third = make_named_tensors(0), make_named_tensors(1), make_named_tensors(2)
        weights = {}
        handle1 = sender.export(first, 1)
        receiver.receive(IpcHandle.from_bytes(handle1.to_bytes()), _adopt(weights))
        assert all(bitwise_equal(weights[name], t) for name, t in first)
        # zero copy: the engine's tensor IS memory of the mapped buffer (same storage, no clone)
        adopted_v1 = dict(weights)
        storage_v1 = adopted_v1["model.embed_tokens.weight"].untyped_storage().data_ptr()
        assert all(t.untyped_storage().data_ptr() == storage_v1 for t in adopted_v1.values())

        handle2 = sender.export(second, 2)  # goes into the other buffer
        assert handle2.location["path"] != handle1.location["path"]
        # version 1's tensors, still held by the engine, were not overwritten by the export
        assert all(bitwise_equal(adopted_v1[name], t) for name, t in first)
        receiver.receive(handle2, _adopt(weights))
        assert all(bitwise_equal(weights[name], t) for name, t in second)
        assert all(bitwise_equal(adopted_v1[name], t) for name, t in first)

        handle3 = sender.export(third, 3)  # back into buffer 1: version 2 (in use) is untouched
        assert handle3.location == handle1.location
        assert all(bitwise_equal(weights[name], t) for name, t in second)
        receiver.receive(handle3, _adopt(weights))
        assert all(bitwise_equal(weights[name], t) for name, t in third)
        assert receiver.last_version == 3
    finally:
        sender.close()
    # the sender removed its files; the engine's adopted tensors still hold the mapping
    assert not os.path.exists(handle1.location["path"])
    assert all(bitwise_equal(weights[name], t) for name, t in third)


def test_adopt_tampered_buffer_applies_nothing_and_keeps_the_adopted_weights():
    sender, receiver = IpcSender("cpu", num_buffers=2), IpcReceiver(adopt=True)
    try:
        first = make_named_tensors(0)
        weights = {}
        receiver.receive(sender.export(first, 1), _adopt(weights))
        handle = sender.export(make_named_tensors(1), 2)
        path, size = handle.location["path"], handle.location["size"]
        other_view = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
        other_view[100] ^= 0x01
        calls = []
        with pytest.raises(ChecksumError, match="version 2.*model.embed_tokens.weight"):
            receiver.receive(handle, calls.append)
        assert calls == [] and receiver.last_version == 1
        assert all(bitwise_equal(weights[name], t) for name, t in first)
    finally:
        sender.close()


def test_adopt_refuses_a_handle_into_the_buffer_in_use():
    sender, receiver = IpcSender("cpu"), IpcReceiver(adopt=True)  # single buffer: misconfigured
    try:
        weights = {}
        receiver.receive(sender.export(make_named_tensors(0), 1), _adopt(weights))
        calls = []
        with pytest.raises(SyncError, match="buffer that holds the adopted version 1"):
            receiver.receive(sender.export(make_named_tensors(1), 2), calls.append)
        assert calls == [] and receiver.last_version == 1
    finally:
        sender.close()
    with pytest.raises(ValueError, match="num_buffers"):
        IpcSender("cpu", num_buffers=3)


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_senders_buffer_is_removed_when_a_sender_starts(tmp_path, monkeypatch):
    """A sender killed before `close` leaves its buffer (as large as the weights) in RAM-backed
    /dev/shm; the next sender removes it: only `rl_sync_<dead pid>_<id>.buf` regular files of
    this user, never a live sender's buffer, a link (nor its target) or another name."""
    import uuid

    import rl_sync.ipc as ipc

    monkeypatch.setattr(ipc, "shm_dir", lambda: str(tmp_path))
    dead, alive = _dead_pid(), os.getpid()

    def name(pid: int) -> str:
        return f"rl_sync_{pid}_{uuid.uuid4().hex}.buf"

    orphan, live = tmp_path / name(dead), tmp_path / name(alive)
    other, target, link = tmp_path / f"x_{dead}.buf", tmp_path / "target", tmp_path / name(dead)
    for path in (orphan, live, other, target):
        path.write_bytes(b"w" * 64)
    link.symlink_to(target)
    sender = IpcSender("cpu")  # sweeps at start
    try:
        assert not orphan.exists()
        assert live.exists() and other.exists() and link.is_symlink() and target.exists()
        handle = sender.export(make_named_tensors(0), 1)
        assert os.path.dirname(handle.location["path"]) == str(tmp_path)
        assert ipc.remove_orphaned_buffers() == []  # its own buffer: its process lives
        assert os.path.exists(handle.location["path"])
    finally:
        sender.close()


@pytest.mark.parametrize(
    ("row", "why"),
    [
        (["w", "float32", [3], 0, 4], r"shape \[3\] for 4 elements"),
        (["w", "float32", [2, 2], 0], "expected 5"),
        (["w", "float99", [4], 0, 4], "unknown dtype 'float99'"),
        (["w", "float32", [4], "x", 4], "invalid literal"),
    ],
)
def test_malformed_tensor_row_is_a_sync_error(row, why):
    """Each row of a handle's tensor table is checked, also under a matching digest (a sender
    that built a bad table sealed it as it was)."""
    sender, receiver = IpcSender("cpu"), IpcReceiver()
    try:
        good = sender.export([("w", torch.ones(4))], 1)
        handle = IpcHandle(1, "shm_file", good.location, good.nbytes, good.checksum, [row]).seal()
        with pytest.raises(SyncError, match=why):
            receiver.open(handle)
    finally:
        sender.close()


@pytest.mark.xdist_group("dist")
def test_malformed_handle_over_a_group_is_rejected_not_left_hanging(tmp_path):
    """A receiver that meets a bad row answers with a rejection the sender hears at once
    (before: a RuntimeError ended the receiver and the sender's group broke under it)."""
    from rl_sync.transfer import PROTOCOL, _exchange_verdict, _send_header

    with _receiver_over_a_group(tmp_path, syncs=1) as (group, sender, results):
        good = sender.export([("w", torch.ones(2, 2))], 1)
        bad_row = [["w", "float32", [3], 0, 4]]  # 4 elements under a 3-element shape
        handle = dataclasses.replace(good, tensors=bad_row).seal().to_json()
        _send_header(group, 0, {**handle, "protocol": PROTOCOL}, 20.0)
        assert _exchange_verdict(group, False, 20.0) is True
        kind, name, message = results.get(timeout=60)
        assert (kind, name) == ("error", "SyncError") and "'w' has shape [3]" in message


@pytest.mark.xdist_group("dist")
def test_a_handle_that_is_not_json_fails_the_sender_at_once(tmp_path, monkeypatch):
    """The receiver cannot decode the handle: before, it raised before the verdict and
    `send_over` waited out its timeout; now both sides fail at the header, and the next update
    goes through the same group."""
    import time

    from rl_sync import transfer

    real_encode = transfer._encode_header
    with _receiver_over_a_group(tmp_path, syncs=2) as (group, sender, results):
        monkeypatch.setattr(transfer, "_encode_header", lambda h: b"#" + real_encode(h)[1:])
        start = time.monotonic()
        with pytest.raises(SyncError, match="rejected by a receiver"):
            sender.send_over(group, make_named_tensors(0), 1, timeout_s=60.0)
        assert time.monotonic() - start < 15.0  # at the header, not at the 60 s timeout
        monkeypatch.undo()
        kind, name, message = results.get(timeout=60)
        assert (kind, name) == ("error", "SyncError") and "is not valid JSON" in message
        sender.send_over(group, make_named_tensors(1), 2)
        assert results.get(timeout=60) == ("ok", 2)


def _swap_names(rows, a, b):
    return [[{a: b, b: a}.get(row[0], row[0]), *row[1:]] for row in rows]


def _offset_of(rows, name):
    return next(row[3] for row in rows if row[0] == name)


@pytest.mark.parametrize(
    "tamper",
    [
        # two tensors of the same dtype and shape trade names: the bytes land under the wrong one
        lambda h: {
            **h,
            "tensors": _swap_names(h["tensors"], "model.embed_tokens.weight", "lm_head.weight"),
        },
        # a [64, 32] tensor read as [32, 64]: same element count, so every row check passes
        lambda h: {
            **h,
            "tensors": [
                [*row[:2], row[2][::-1], *row[3:]] if row[0] == "lm_head.weight" else row
                for row in h["tensors"]
            ],
        },
        # one tensor pointed at another's bytes (same size), inside the buffer
        lambda h: {
            **h,
            "tensors": [
                [*row[:3], _offset_of(h["tensors"], "lm_head.weight"), row[4]]
                if row[0] == "model.embed_tokens.weight"
                else row
                for row in h["tensors"]
            ],
        },
    ],
    ids=["names_swapped", "shape_transposed", "offset_moved"],
)
def test_a_tampered_tensor_table_is_refused_before_it_is_used(tamper):
    """The buffer's checksum cannot see a changed tensor table; the handle's digest does."""
    sender, receiver = IpcSender("cpu"), IpcReceiver(last_version=0)
    try:
        handle = sender.export(make_named_tensors(0), 1).to_json()
        calls = []
        with pytest.raises(
            ChecksumError, match="IPC handle of version 1 does not match its digest"
        ):
            receiver.receive(IpcHandle.from_json(tamper(handle)), calls.append)
        assert calls == [] and receiver.last_version == 0
        receiver.receive(IpcHandle.from_json(handle), calls.append)  # the untouched one is fine
        assert receiver.last_version == 1
    finally:
        sender.close()


def test_a_handle_of_the_previous_wire_version_gets_a_clear_error():
    sender = IpcSender("cpu")
    try:
        old = {**sender.export([("w", torch.ones(4))], 1).to_json(), "protocol": "rl_sync.ipc/1"}
        old.pop("digest", None)  # an older sender sent none
        with pytest.raises(
            SyncError, match="speaks 'rl_sync.ipc/1', this receiver 'rl_sync.ipc/2'"
        ):
            IpcHandle.from_json(old)
    finally:
        sender.close()


@pytest.mark.xdist_group("dist")
def test_a_tampered_handle_over_a_group_is_rejected_and_the_sender_hears_it(tmp_path):
    from rl_sync.transfer import PROTOCOL, _exchange_verdict, _send_header

    with _receiver_over_a_group(tmp_path, syncs=2) as (group, sender, results):
        handle = sender.export(make_named_tensors(0), 1).to_json()
        handle["tensors"] = _swap_names(
            handle["tensors"], "model.embed_tokens.weight", "lm_head.weight"
        )
        _send_header(group, 0, {**handle, "protocol": PROTOCOL}, 20.0)
        assert _exchange_verdict(group, False, 20.0) is True  # the receiver rejected it
        kind, name, message = results.get(timeout=60)
        assert (kind, name) == ("error", "ChecksumError") and "does not match its digest" in message
        assert not (tmp_path / "v1.pt").exists()  # nothing applied
        sender.send_over(group, make_named_tensors(1), 2)  # the group is still in step
        assert results.get(timeout=60) == ("ok", 2)
