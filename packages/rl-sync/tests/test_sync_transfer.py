"""Weight transfer between real processes over a standalone gloo group.

Topology: two trainer ranks form their own default world (gloo) and hold flat shards of every
tensor; they all-gather full tensors and trainer rank 0 sends them to a receiver process over a
separate sync group. Both groups are used in the same processes.
"""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from rl_sync.group import free_port
from rl_sync.store import new_rendezvous_token, node_local_store_path
from rl_sync.testing import (
    bitwise_equal,
    make_named_tensors,
    mp_context,
    receiver_main,
    spawn,
    trainer_main,
)

pytestmark = pytest.mark.xdist_group("dist")

TIMEOUT_S = 60.0
_TOKENS: list[str] = []  # the trainer worlds' rendezvous of the running test


@pytest.fixture(autouse=True)
def _remove_rendezvous_files():
    """A trainer rank that a fault test kills never destroys its store: remove the file after."""
    yield
    while _TOKENS:
        node_local_store_path(_TOKENS.pop()).unlink(missing_ok=True)


def _run(
    tmp_path, *, versions, receiver_syncs, corrupt_bucket=None, fault=None, sync_timeout_s=30.0
):
    ctx = mp_context()
    port_queue, trainer_results, receiver_results = ctx.Queue(), ctx.Queue(), ctx.Queue()
    token = new_rendezvous_token()
    _TOKENS.append(token)
    out_path = str(tmp_path / "received.pt")
    receiver = spawn(
        receiver_main,
        port_queue,
        receiver_results,
        out_path=out_path,
        timeout_s=sync_timeout_s,
        syncs=receiver_syncs,
        fault=fault,
    )
    trainers = [
        spawn(
            trainer_main,
            rank,
            2,
            token,
            port_queue,
            trainer_results,
            versions=versions,
            bucket_bytes=512,
            timeout_s=sync_timeout_s,
            corrupt_bucket=corrupt_bucket,
        )
        for rank in range(2)
    ]
    receiver.queues = (port_queue, trainer_results, receiver_results)  # keep alive for the children
    return receiver, trainers, trainer_results, receiver_results, out_path


def _get(queue, timeout=TIMEOUT_S):
    item = queue.get(timeout=timeout)
    assert item[0] != "crash", item[1]
    return item


def _join(*processes):
    for process in processes:
        process.join(timeout=TIMEOUT_S)
        if process.is_alive():
            process.kill()


def test_two_trainer_ranks_to_one_receiver_bitwise_identical(tmp_path):
    receiver, trainers, trainer_results, receiver_results, out_path = _run(
        tmp_path, versions=[1, 2], receiver_syncs=[{}, {}]
    )
    first, second = _get(trainer_results), _get(trainer_results)
    got_first, got_second = _get(receiver_results), _get(receiver_results)
    _join(receiver, *trainers)
    assert first[:2] == ("ok", 1) and second[:2] == ("ok", 2)
    assert first[2] > 3  # several buckets at 512 bytes
    assert got_first[:2] == ("ok", 1) and got_second[:2] == ("ok", 2)
    expected = make_named_tensors(0)
    received = torch.load(out_path, weights_only=True)
    assert sorted(received) == sorted(name for name, _ in expected)
    for name, tensor in expected:
        assert bitwise_equal(received[name], tensor), name
    assert all(process.exitcode == 0 for process in trainers)


def test_corrupted_bucket_is_detected_and_nothing_is_applied(tmp_path):
    receiver, trainers, trainer_results, receiver_results, _ = _run(
        tmp_path, versions=[1, 2], receiver_syncs=[{}, {}], corrupt_bucket=2
    )
    sent_first, sent_second = _get(trainer_results), _get(trainer_results)
    got_first, got_second = _get(receiver_results), _get(receiver_results)
    _join(receiver, *trainers)
    status, error_type, message, applied = got_first
    assert (status, error_type, applied) == ("error", "ChecksumError", 0)
    assert "bucket 2" in message and "checksum mismatch" in message
    assert "model." in message or "buffers." in message or "lm_head" in message  # names tensors
    assert sent_first[:2] == ("error", "SyncError") and "rejected" in sent_first[2]
    # the group stays usable: the next (also corrupted) sync is rejected the same way, not hung
    assert got_second[1] == "ChecksumError" and sent_second[1] == "SyncError"


def test_version_mismatch_and_stale_version_are_rejected(tmp_path):
    syncs = [{"expected_version": 7}, {"last_version": 5}, {}]
    receiver, trainers, trainer_results, receiver_results, _ = _run(
        tmp_path, versions=[3, 4, 6], receiver_syncs=syncs
    )
    sent = [_get(trainer_results) for _ in range(3)]
    got = [_get(receiver_results) for _ in range(3)]
    _join(receiver, *trainers)
    assert got[0][:2] == ("error", "VersionError") and "7 was expected" in got[0][2]
    assert got[0][3] == 0
    assert got[1][:2] == ("error", "VersionError") and "stale version 4" in got[1][2]
    assert got[2][:2] == ("ok", 6)
    assert [s[0] for s in sent] == ["error", "error", "ok"]


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_receiver_dying_mid_transfer_fails_the_sender_within_timeout(tmp_path, how):
    sync_timeout_s = 4.0
    # broadcast #1/#2 are the first header, #3 the first payload: die on the second bucket's payload
    receiver, trainers, trainer_results, _receiver_results, _ = _run(
        tmp_path,
        versions=[1],
        receiver_syncs=[{}],
        fault=(how, 6),
        sync_timeout_s=sync_timeout_s,
    )
    try:
        status, error_type, message, elapsed = _get(trainer_results)
    finally:
        if how == "stop" and receiver.pid is not None:
            os.kill(receiver.pid, signal.SIGKILL)
        _join(receiver, *trainers)
    assert status == "error"
    assert error_type in {"CommError", "CollectiveTimeoutError"}
    assert "sync group 'weight_sync'" in message
    assert elapsed < sync_timeout_s + 3.0
    if how == "stop":  # a frozen peer is only noticed by the timeout
        assert error_type == "CollectiveTimeoutError" or "timed out" in message.lower()
        assert elapsed >= sync_timeout_s * 0.5


def test_rendezvous_without_peers_times_out_with_clear_error():
    from rl_sync.group import CommError, init_group

    start = time.monotonic()
    with pytest.raises(CommError, match="could not"):
        init_group("127.0.0.1", free_port(), 1, 2, timeout_s=1.0)
    assert time.monotonic() - start < 10.0


# rl-sync depends on torch only: a receiver in an environment without numpy used to die decoding
# the first header (`Tensor.numpy()`), and the sender then waited out its collective timeout.
_HEADER_WITHOUT_NUMPY = """
import sys
sys.modules["numpy"] = None  # import numpy raises ImportError, as when it is not installed
import torch
from rl_sync import transfer

header = {"protocol": transfer.PROTOCOL, "version": 3, "names": ["w" * 50] * 200}
data = transfer._encode_header(header)

class Wire:
    '''Plays the sender's two broadcasts (length, then body) into the receiver's tensors.'''
    device = torch.device("cpu")
    def __init__(self):
        self.sent = [torch.tensor([len(data)]), torch.frombuffer(bytearray(data), dtype=torch.uint8)]
    def broadcast(self, tensor, src, timeout_s):
        tensor.copy_(self.sent.pop(0))

assert transfer._recv_header(Wire(), 0, 5.0) == header
print("OK")
"""


def test_receiver_decodes_headers_without_numpy():
    out = subprocess.run(
        [sys.executable, "-c", _HEADER_WITHOUT_NUMPY], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stderr[-2000:]


def _listening_ipv4() -> set[str]:
    """IPv4 addresses with a LISTEN socket of this machine (/proc/net/tcp)."""
    from pathlib import Path

    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state != "0A":
            continue
        hex_ip = local.split(":")[0]
        found.add(".".join(str(int(hex_ip[i : i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


def test_each_rank_listens_on_its_local_addr():
    """A group spanning nodes: every rank's gloo pairs listen on its own node's address
    (`local_addr`), which is what peers on other nodes connect to."""
    import queue
    import threading

    import torch

    from rl_sync.group import init_group

    ports: queue.Queue = queue.Queue()
    groups: dict[int, object] = {}
    errors: list[BaseException] = []

    def rank(r: int, addr: str) -> None:
        try:
            if r == 0:
                groups[r] = init_group(
                    "127.0.0.1", 0, 0, 2, timeout_s=30, on_port=ports.put, local_addr=addr
                )
            else:
                groups[r] = init_group(
                    "127.0.0.1", ports.get(timeout=30), 1, 2, timeout_s=30, local_addr=addr
                )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=rank, args=(r, a)) for r, a in ((0, "127.0.0.2"), (1, "127.0.0.3"))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    try:
        assert {"127.0.0.2", "127.0.0.3"} <= _listening_ipv4()
        tensors = [torch.arange(4.0), torch.zeros(4)]
        works = [threading.Thread(target=groups[r].broadcast, args=(tensors[r], 0)) for r in (0, 1)]
        for w in works:
            w.start()
        for w in works:
            w.join(timeout=60)
        assert torch.equal(tensors[1], torch.arange(4.0))
    finally:
        for g in groups.values():
            g.close()
