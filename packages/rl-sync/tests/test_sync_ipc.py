"""Colocated (IPC) weight updates: shared memory on CPU; device transports by decision logic."""

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
    handle = IpcHandle(1, "shm_file", {"path": str(tmp_path / "x.buf"), "size": 8}, 8, 0, [])
    with pytest.raises(SyncError, match="outside"):
        IpcReceiver().open(handle)


@pytest.mark.xdist_group("dist")
def test_colocated_update_between_processes_over_a_group(tmp_path):
    ctx = mp_context()
    port_queue, results = ctx.Queue(), ctx.Queue()
    receiver = spawn(ipc_receiver_main, port_queue, results, out_dir=str(tmp_path), syncs=2)
    sender = IpcSender("cpu")
    try:
        group = init_group("127.0.0.1", 0, 0, 2, timeout_s=30.0, on_port=port_queue.put)
        states = {1: make_named_tensors(10), 2: make_named_tensors(11)}
        for version, named in states.items():
            metrics = sender.send_over(group, named, version)
            assert metrics.version == version and metrics.num_tensors == len(named)
            reply = results.get(timeout=60)
            assert reply == ("ok", version), reply
            got = torch.load(tmp_path / f"v{version}.pt", weights_only=True)
            assert all(bitwise_equal(got[name], t) for name, t in named)
        group.close()
    finally:
        sender.close()
        receiver.join(timeout=30)
        if receiver.is_alive():
            receiver.kill()
