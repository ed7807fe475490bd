"""Bucket packing, unpacking and the checksum (in process)."""

import pytest
import torch

from rl_sync.buckets import BucketPacker, BucketSpec, TensorSlot, checksum, unpack
from rl_sync.testing import bitwise_equal, make_named_tensors


def _roundtrip(named, bucket_bytes):
    out = {}
    buckets = []
    for bucket in BucketPacker(bucket_bytes).pack(named):
        payload = bucket.payload.clone()  # the packer reuses its staging buffer
        assert checksum(payload) == bucket.spec.checksum
        buckets.append(bucket.spec)
        out.update({name: t.clone() for name, t in unpack(bucket.spec, payload)})
    return out, buckets


@pytest.mark.parametrize("bucket_bytes", [8, 200, 1 << 10, 1 << 20])
def test_pack_unpack_roundtrip_is_bitwise(bucket_bytes):
    named = make_named_tensors(3)
    out, specs = _roundtrip(named, bucket_bytes)
    assert list(out) != [] and sorted(out) == sorted(n for n, _ in named)
    for name, tensor in named:
        assert bitwise_equal(out[name], tensor), name
    assert sorted(s.index for s in specs) == list(range(len(specs)))
    for spec in specs:
        dtypes = {spec.dtype}
        assert len(dtypes) == 1
        if len(spec.tensors) > 1:  # packed buckets respect the size; big tensors travel alone
            assert spec.nbytes <= bucket_bytes + 7


def test_buckets_are_dtype_homogeneous_and_sized():
    named = [(f"w{i}", torch.full((10,), float(i), dtype=torch.bfloat16)) for i in range(10)]
    named += [(f"f{i}", torch.full((5,), float(i))) for i in range(4)]
    specs = [b.spec for b in BucketPacker(60).pack(named)]
    bf16 = [s for s in specs if s.dtype == "bfloat16"]
    fp32 = [s for s in specs if s.dtype == "float32"]
    assert [len(s.tensors) for s in bf16] == [3, 3, 3, 1]  # 20 bytes each, 60-byte buckets
    assert [len(s.tensors) for s in fp32] == [3, 1]
    assert all(s.nbytes % 8 == 0 for s in specs)


def test_big_contiguous_tensor_travels_alone_without_copy():
    big = torch.randn(1000)
    bucket = next(iter(BucketPacker(256).pack([("big", big)])))
    assert bucket.payload.data_ptr() == big.data_ptr()
    assert bucket.spec.tensors[0].name == "big"


def test_duplicate_names_and_unsupported_dtypes_are_errors():
    with pytest.raises(ValueError, match="'a' appears twice"):
        list(BucketPacker(64).pack([("a", torch.ones(2)), ("a", torch.ones(2))]))
    with pytest.raises(ValueError, match="uint16|cannot be transferred"):
        list(BucketPacker(64).pack([("u", torch.ones(2, dtype=torch.uint16))]))
    with pytest.raises(TypeError, match="'x' is a list"):
        list(BucketPacker(64).pack([("x", [1, 2])]))  # type: ignore[list-item]


def _reference_checksum(data: bytes) -> int:
    """Plain-loop re-implementation of rl_sync.buckets.checksum."""
    mask = (1 << 64) - 1
    n = len(data)
    total = n * 0x9E3779B97F4A7C15
    words = [
        int.from_bytes(data[i : i + 8], "little", signed=True) for i in range(0, n // 8 * 8, 8)
    ]
    if words:
        lanes = min(64, len(words))
        per = len(words) // lanes
        mixed = sum((2 * k + 1) * sum(words[k * per : (k + 1) * per]) for k in range(lanes))
        rest = sum(words[lanes * per :])
        total += mixed + 0xFF51AFD7ED558CCD * rest
    tail = data[n // 8 * 8 :]
    total += 0xC4CEB9FE1A85EC53 * sum((i + 1) * b for i, b in enumerate(tail))
    return total & mask


@pytest.mark.parametrize("nbytes", [0, 5, 8, 64, 1000, 4099])
def test_checksum_matches_plain_loop_reference(nbytes):
    data = torch.randint(
        0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(nbytes)
    )
    assert checksum(data) == _reference_checksum(bytes(data.tolist()))


def test_checksum_detects_flips_swaps_and_truncation():
    data = torch.randint(
        0, 256, (8 * 640,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )
    base = checksum(data)
    for position in (0, 7, 2000, data.numel() - 1):
        for bit in (0x01, 0x80):
            flipped = data.clone()
            flipped[position] ^= bit
            assert checksum(flipped) != base, (position, bit)
    words = data.view(torch.int64).clone()
    words[[0, 100]] = words[[100, 0]]  # move data between lanes
    assert checksum(words.view(torch.uint8)) != base
    assert checksum(data[:-8]) != base
    assert checksum(torch.zeros(16, dtype=torch.uint8)) != checksum(
        torch.zeros(24, dtype=torch.uint8)
    )


def test_unpack_rejects_short_payload_naming_the_bucket():
    bucket = next(iter(BucketPacker(1 << 10).pack([("layer.w", torch.ones(4))])))
    with pytest.raises(ValueError, match=r"bucket 0 \(float32, 1 tensors: layer.w\)"):
        unpack(bucket.spec, bucket.payload[:8])


@pytest.mark.parametrize("num_staging", [1, 2])
def test_double_buffered_packer_keeps_the_previous_bucket_intact(num_staging):
    """With two staging buffers bucket i is still intact while bucket i + 1 is packed (its send
    may be in flight); with one, packing the next bucket overwrites it."""
    named = [(f"t{i}", torch.full((4,), float(i))) for i in range(6)]  # 16 B each, 2 per bucket
    packer = BucketPacker(32, num_staging=num_staging)
    previous = None
    intact = []
    for bucket in packer.pack(named):
        if previous is not None:
            spec, payload = previous
            intact.append(checksum(payload) == spec.checksum)
        previous = (bucket.spec, bucket.payload)
    assert len(intact) == 2
    assert all(intact) if num_staging == 2 else not any(intact)
    with pytest.raises(ValueError, match="num_staging"):
        BucketPacker(32, num_staging=0)


@pytest.mark.parametrize(
    ("shape", "numel", "why"),
    [
        ((3,), 4, r"shape \[3\] for 4 elements"),  # view() raised a RuntimeError
        ((-1,), 4, r"shape \[-1\] for 4 elements"),  # view() took -1 as a wildcard
        ((8,), 8, "hold 32 bytes, the payload 16"),  # more elements than the payload holds
    ],
)
def test_unpack_refuses_a_header_whose_shapes_do_not_fit(shape, numel, why):
    """A header's shapes and counts come from another process: a mismatch is the ValueError
    the receiver turns into a rejection, never a RuntimeError (or a view of another shape)."""
    spec = BucketSpec(0, "float32", 16, 0, (TensorSlot("layer.w", shape, 0, numel),))
    with pytest.raises(ValueError, match=why):
        unpack(spec, torch.zeros(16, dtype=torch.uint8))


def test_header_digest_is_sha256_of_the_canonical_json_without_the_digest():
    import hashlib

    from rl_sync.buckets import digest_problem, header_digest, sealed

    header = {"version": 3, "tensors": [["w", [2, 3], 0, 6]], "digest": "ignored"}
    reference = hashlib.sha256(b'{"tensors":[["w",[2,3],0,6]],"version":3}').hexdigest()
    assert header_digest(header) == reference
    assert header_digest(dict(reversed(list(header.items())))) == reference  # key order is free
    good = sealed({"version": 3, "tensors": [["w", [2, 3], 0, 6]]})
    assert good["digest"] == reference and digest_problem(good, "header 0") is None
    bad = {**good, "tensors": [["w", [3, 2], 0, 6]]}
    assert "header 0 does not match its digest" in str(digest_problem(bad, "header 0"))
    assert "carries no 'digest'" in str(digest_problem({"version": 3}, "header 0"))
