"""CUDA IPC between two processes on one GPU: the trainer exports, the engine process maps the
buffer, verifies the checksum on the device and applies; a tampered buffer applies nothing.
Runs only with ``-m gpu`` on a CUDA machine."""

from __future__ import annotations

import pytest
import torch

from rl_sync.group import init_group
from rl_sync.ipc import IpcSender
from rl_sync.testing import bitwise_equal, ipc_receiver_main, make_named_tensors, mp_context, spawn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _cuda_state(seed: int) -> list[tuple[str, torch.Tensor]]:
    return [(name, t.to("cuda")) for name, t in make_named_tensors(seed)]


def test_cuda_ipc_update_arrives_bitwise_and_tampering_is_caught(tmp_path):
    ctx = mp_context()
    port_queue, results = ctx.Queue(), ctx.Queue()
    child = spawn(
        ipc_receiver_main, port_queue, results, out_dir=str(tmp_path), syncs=3, device="cuda:0"
    )
    sender = IpcSender("cuda:0")
    assert sender.transport == "cuda_ipc"
    try:
        # handles are control data: the group is gloo on CUDA too (NCCL refuses two ranks per GPU)
        group = init_group(
            "127.0.0.1", 0, 0, 2, backend="gloo", timeout_s=60, on_port=port_queue.put
        )
        for version in (1, 2):
            state = _cuda_state(version)
            sender.send_over(group, state, version)
            reply = results.get(timeout=120)
            assert reply == ("ok", version, ["cuda"]), reply  # mapped views live on the GPU
            got = torch.load(tmp_path / f"v{version}.pt", weights_only=True)
            assert all(bitwise_equal(got[name], t.cpu()) for name, t in state)
        # flip one byte of the exported buffer after the checksum was taken: nothing is applied
        export = sender.export

        def tampered_export(named, version):
            handle = export(named, version)
            buffer = sender._buffers[0]
            assert buffer is not None and buffer.is_cuda
            buffer[128] ^= 0x01
            return handle

        sender.export = tampered_export  # type: ignore[method-assign]
        with pytest.raises(Exception, match="rejected"):
            sender.send_over(group, _cuda_state(3), 3)
        reply = results.get(timeout=120)
        assert reply[:2] == ("error", "ChecksumError"), reply
        assert not (tmp_path / "v3.pt").exists()
        group.close()
    finally:
        sender.close()
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
