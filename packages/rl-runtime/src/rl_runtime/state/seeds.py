"""Every random stream of a run, named, each derived from the run's `seed` (one home for the
formulas and for seeding a process's global generators).

A stream is a function of the run's seed and of where it is drawn (a worker's role and rank, a
split, an epoch, a step, a generation round, a sample), never of the clock or of an earlier
draw: a resumed run draws what an uninterrupted one does. Streams that start from the same seed
are kept apart by the offsets and strides below.

| stream | seed |
|---|---|
| the driver's global generators (torch, python, numpy) | `seed` |
| a worker process's global generators | `seed + WORKER_OFFSET[kind] + rank` |
| an engine's own sampler | `seed + rank` |
| env of group g in (split, epoch) | blake2b of `seed/split/epoch/g`, mod 2**31 - 1 |
| the episode of member m of a group (its sampling) | blake2b of `env seed/member/m`, mod 2**31 - 1 |
| a rollout batch's sampling (split, epoch) | `seed * STEP_STRIDE + epoch * 7 + (0 train, 1 val)` |
| RLVR held-out evaluation | `seed * STEP_STRIDE + 1` |
| RLVR generation round (step, groups drawn before it) | `seed * STEP_STRIDE + step * 7 + drawn * ROUND_STRIDE` |
| sample i of a request sent one sample at a time | `request seed * SAMPLE_STRIDE + i` |
| DPO epoch order | `seed * EPOCH_STRIDE + epoch` |
| the agentic warm-up's demonstration envs | `seed + DEMO_OFFSET` |
| a supervised warm-up's batch order | `seed` (its own torch generator) |
"""

from __future__ import annotations

import hashlib
import random

STEP_STRIDE = 100_003
"""Per-run stride of the rollout sampling seeds (a prime: runs with nearby seeds do not share)."""
ROUND_STRIDE = 100_000_007
"""Stride of an RLVR step's generation rounds (dynamic sampling's refills)."""
SAMPLE_STRIDE = 1009
"""Stride of the samples of one request sent one sample at a time (n=1 per request)."""
EPOCH_STRIDE = 1_000_003
"""Per-run stride of DPO's epoch orders."""
DEMO_OFFSET = 1_000_000
"""Offset of the agentic warm-up's demonstration envs from the training envs' seeds."""
WORKER_OFFSET = {"train": 0, "rollout": 1000, "judge": 2000, "reward_model": 3000}
"""Offset of each worker kind's process seed: colocated workers of one rank differ."""


def seed_globals(seed: int) -> None:
    """Seed this process's global generators: torch, python's `random` and numpy's (unseeded,
    python's and numpy's would start from OS entropy, and a run could not be repeated)."""
    import numpy as np
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def worker_seed(seed: int, kind: str, rank: int) -> int:
    """The process seed of worker `rank` of `kind` (a key of `WORKER_OFFSET`)."""
    return seed + WORKER_OFFSET[kind] + rank


def engine_seed(seed: int, rank: int) -> int:
    """The seed an inference engine of rank `rank` samples with when a request has none."""
    return seed + rank


def env_seed(seed: int, split: str, epoch: int, group: int) -> int:
    """A 31-bit env seed from (run seed, split, epoch, group) that does not depend on Python's
    hash."""
    h = hashlib.blake2b(f"{seed}/{split}/{epoch}/{group}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") % (2**31 - 1)


def member_seed(env_seed_value: int, member: int) -> int:
    """The sampling seed of the `member`-th episode of a group playing env seed `env_seed_value`
    (the group's members play one env and sample differently)."""
    h = hashlib.blake2b(f"{env_seed_value}/member/{member}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") % (2**31 - 1)


def batch_sampling_seed(seed: int, split: str, epoch: int) -> int:
    """The sampling seed of a rollout batch of `split` ("train" or another) in `epoch`."""
    return seed * STEP_STRIDE + epoch * 7 + (0 if split == "train" else 1)


def eval_seed(seed: int) -> int:
    """The sampling seed of RLVR's held-out evaluation (every evaluation alike)."""
    return seed * STEP_STRIDE + 1


def generation_round_seed(seed: int, step: int, groups_drawn: int) -> int:
    """The sampling seed of an RLVR generation round of `step`, after `groups_drawn` groups."""
    return seed * STEP_STRIDE + step * 7 + groups_drawn * ROUND_STRIDE


def sample_seed(request_seed: int, index: int) -> int:
    """The seed of sample `index` of a request sent as one request per sample."""
    return request_seed * SAMPLE_STRIDE + index


def epoch_order_seed(seed: int, epoch: int) -> int:
    """The seed of DPO's permutation of the examples in `epoch`."""
    return seed * EPOCH_STRIDE + epoch


def demo_env_seed(seed: int) -> int:
    """The base env seed of the agentic warm-up's demonstrations (apart from training's)."""
    return seed + DEMO_OFFSET
