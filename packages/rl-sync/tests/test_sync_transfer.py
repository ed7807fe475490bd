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
from collections.abc import Callable
from typing import Any

import pytest
import torch

from rl_sync.group import CommGroup, free_port, init_group
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
    from rl_sync.group import CommError

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
    def all_reduce(self, tensor, op, timeout_s):
        pass  # the sender's verdicts: accepted

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
    groups = _group_pair(30.0, local_addrs=("127.0.0.2", "127.0.0.3"))
    try:
        assert {"127.0.0.2", "127.0.0.3"} <= _listening_ipv4()
        tensors = [torch.arange(4.0), torch.zeros(4)]
        _both(
            lambda: groups[0].broadcast(tensors[0], 0), lambda: groups[1].broadcast(tensors[1], 0)
        )
        assert torch.equal(tensors[1], torch.arange(4.0))
    finally:
        for g in groups:
            g.close()


# ------------------------------------------------------------------------------------------------
# Wire limits and header digests, over a real gloo group between two threads of this process
# ------------------------------------------------------------------------------------------------
def _group_pair(
    timeout_s: float = 20.0, *, local_addrs: tuple[str | None, str | None] = (None, None)
) -> tuple[CommGroup, CommGroup]:
    """Rank 0 and rank 1 of a real two-rank gloo group, each made in its own thread (listening
    on its `local_addrs` entry)."""
    import queue

    ports: queue.Queue = queue.Queue()

    def join(rank: int) -> CommGroup:
        port = 0 if rank == 0 else ports.get(timeout=30)
        return init_group(
            "127.0.0.1",
            port,
            rank,
            2,
            timeout_s=timeout_s,
            on_port=ports.put if rank == 0 else None,
            local_addr=local_addrs[rank],
        )

    first, second = _both(lambda: join(0), lambda: join(1))
    assert isinstance(first, CommGroup) and isinstance(second, CommGroup), (first, second)
    return first, second


def _both(on_sender: Callable[[], Any], on_receiver: Callable[[], Any]) -> list[Any]:
    """Run the two sides at once (threads); each side's return value or raised exception."""
    import threading

    out: list[Any] = [None, None]

    def run(index, fn):
        try:
            out[index] = fn()
        except Exception as exc:  # returned to the test, which asserts on it
            out[index] = exc

    threads = [
        threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate((on_sender, on_receiver))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a side is still waiting"
    return out


def _good_sync_still_works(sender_group, receiver_group, version):
    """A normal sync over the same group afterwards arrives bit for bit (the group is in step)."""
    from rl_sync.transfer import WeightReceiver, WeightSender

    named = make_named_tensors(version)
    got: dict[str, torch.Tensor] = {}
    receiver = WeightReceiver(receiver_group, timeout_s=20.0)
    sent, received = _both(
        lambda: WeightSender(sender_group, 512, timeout_s=20.0).send(named, version),
        lambda: receiver.receive(lambda ts: got.update((n, t.clone()) for n, t in ts)),
    )
    assert not isinstance(sent, Exception) and not isinstance(received, Exception), (sent, received)
    assert all(bitwise_equal(got[name], tensor) for name, tensor in named)


def test_a_header_longer_than_the_limit_is_refused_before_it_is_allocated():
    """A peer announcing a 1 GiB header (old limit: 2 GiB) is refused on its length alone, with
    the size and the limit; nothing else was sent, so the group stays usable."""
    from rl_sync import transfer

    sender_group, receiver_group = _group_pair()
    try:
        announced = 1 << 30
        length = torch.tensor([announced], dtype=torch.int64)
        sender_heard, got = _both(
            lambda: (
                sender_group.broadcast(length, 0, 20.0),
                transfer._exchange_verdict(sender_group, False, 20.0),
            )[1],
            lambda: transfer._recv_header(receiver_group, 0, 20.0),
        )
        assert sender_heard is True  # the receiver's verdict on the length
        assert isinstance(got, transfer.SyncError), got
        assert f"{announced} bytes" in str(got)
        assert f"limit of {transfer.MAX_HEADER_BYTES} bytes" in str(got)
        assert "refused before allocating" in str(got)
        _good_sync_still_works(sender_group, receiver_group, version=1)
    finally:
        sender_group.close()
        receiver_group.close()


def test_a_sender_refuses_a_header_over_the_limit_and_so_does_every_receiver():
    """Names long enough to make a bucket's header exceed the limit: the sender names the size
    and the limit and sends only the length, which the receiver refuses; both leave the sync at
    the same point, and the next sync goes through."""
    from rl_sync import transfer

    sender_group, receiver_group = _group_pair()
    try:
        long_name = "x" * ((64 << 20) // 150)  # 160 rows of ~447 kB: a header over 64 MiB
        named = [(f"w{i}.{long_name}", torch.full((2,), float(i))) for i in range(160)]
        applied: list = []
        sent, received = _both(
            lambda: transfer.WeightSender(sender_group, 1 << 20, timeout_s=20.0).send(named, 1),
            lambda: transfer.WeightReceiver(receiver_group, timeout_s=20.0).receive(applied.extend),
        )
        assert isinstance(sent, transfer.SyncError) and "not sent" in str(sent), sent
        assert f"exceeds the limit of {transfer.MAX_HEADER_BYTES} bytes" in str(sent)
        assert isinstance(received, transfer.SyncError), received
        assert "refused before allocating" in str(received)
        assert applied == []
        _good_sync_still_works(sender_group, receiver_group, version=2)
    finally:
        sender_group.close()
        receiver_group.close()


def _break_header_json(header_bytes: bytes) -> bytes:
    return b"#" + header_bytes[1:]  # no longer JSON


def _quote_the_version(header_bytes: bytes) -> bytes:
    return header_bytes.replace(b'"version":1', b'"version":"1"', 1)  # JSON, fails its digest


def _smaller_receiver_limit(monkeypatch, transfer) -> None:
    """The receiver refuses lengths over 100 bytes (a peer built with a smaller limit); the
    sender's own limit is unchanged, so it announces the length and only the receiver refuses."""
    real = transfer._length_problem
    monkeypatch.setattr(transfer, "_length_problem", lambda size, src: real(size, src, 100))


@pytest.mark.parametrize(
    ("refusal", "why"),
    [
        ("length", "exceeds the limit of 100 bytes"),
        ("not_json", "is not valid JSON"),
        ("digest", "does not match its digest"),
    ],
)
def test_a_header_refused_by_the_receiver_fails_both_sides_at_once(monkeypatch, refusal, why):
    """The receiver refuses the second bucket's header (its length, or a body that does not
    decode or fails its digest). Before, it raised without a verdict and the sender waited out its
    timeout; now the sender hears it at that header, nothing is applied, and the next sync over
    the same group goes through."""
    from rl_sync import transfer

    real_encode = transfer._encode_header
    if refusal == "length":
        _smaller_receiver_limit(monkeypatch, transfer)
    else:
        corrupt = _break_header_json if refusal == "not_json" else _quote_the_version

        def encode(header):  # sender side only: the receiver never encodes
            data = real_encode(header)
            return corrupt(data) if header.get("index") == 1 else data

        monkeypatch.setattr(transfer, "_encode_header", encode)
    timeout_s = 60.0
    sender_group, receiver_group = _group_pair(timeout_s)
    try:
        named = make_named_tensors(0)
        applied: list = []
        sender_took: list[float] = []

        def send():
            start = time.monotonic()
            try:
                return transfer.WeightSender(sender_group, 512, timeout_s=timeout_s).send(named, 1)
            finally:
                sender_took.append(time.monotonic() - start)

        receiver = transfer.WeightReceiver(receiver_group, timeout_s=timeout_s)
        sent, received = _both(send, lambda: receiver.receive(applied.extend))
        monkeypatch.undo()
        assert isinstance(sent, transfer.SyncError), sent
        assert sender_took[0] < timeout_s / 4, (sender_took, sent)  # at that header, not timed out
        assert "rejected by a receiver" in str(sent) and "nothing of it was applied" in str(sent)
        assert isinstance(received, transfer.SyncError), received
        assert why in str(received) and "nothing applied" in str(received), received
        assert applied == [] and receiver.last_version is None
        _good_sync_still_works(sender_group, receiver_group, version=2)
    finally:
        sender_group.close()
        receiver_group.close()


def test_a_corrupted_tensor_table_is_rejected_and_nothing_is_applied(monkeypatch):
    """Two same-shape tensors swap names on the wire after the sender sealed its headers: the
    payload checksums still match (the bytes are intact), the header digests do not. The
    receiver rejects the sync, the sender hears it, and the next sync goes through."""
    from rl_sync import transfer

    real_encode = transfer._encode_header

    def swap_names(header):
        data = real_encode(header)
        a, b = b'"model.embed_tokens.weight"', b'"lm_head.weight"'
        return data.replace(a, b"\0").replace(b, a).replace(b"\0", b)

    sender_group, receiver_group = _group_pair()
    try:
        named = make_named_tensors(0)
        applied: list = []
        monkeypatch.setattr(transfer, "_encode_header", swap_names)
        sent, received = _both(
            lambda: transfer.WeightSender(sender_group, 512, timeout_s=20.0).send(named, 1),
            lambda: transfer.WeightReceiver(receiver_group, timeout_s=20.0).receive(applied.extend),
        )
        monkeypatch.undo()
        assert isinstance(received, transfer.ChecksumError), received
        assert "does not match its digest" in str(received) and "nothing applied" in str(received)
        assert applied == []
        assert isinstance(sent, transfer.SyncError) and "rejected by a receiver" in str(sent)
        _good_sync_still_works(sender_group, receiver_group, version=2)
    finally:
        sender_group.close()
        receiver_group.close()


def test_a_sender_of_the_previous_wire_version_gets_a_clear_error():
    from rl_sync import transfer

    sender_group, receiver_group = _group_pair()
    try:
        old = {"protocol": "rl_sync/1", "version": 1, "final": True}
        sent, got = _both(
            lambda: transfer._send_header(sender_group, 0, old, 20.0),
            lambda: transfer._recv_header(receiver_group, 0, 20.0),
        )
        assert isinstance(got, transfer.SyncError), got
        assert "speaks 'rl_sync/1', this receiver 'rl_sync/2'" in str(got)
        assert isinstance(sent, transfer.SyncError) and "rejected by a receiver" in str(sent)
        _good_sync_still_works(sender_group, receiver_group, version=1)
    finally:
        sender_group.close()
        receiver_group.close()
