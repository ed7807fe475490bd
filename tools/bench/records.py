"""Encode/decode throughput of the wire records: msgspec msgpack vs pickle, in one run.

uv run python tools/bench/records.py [--trajectories 256] [--tokens 2048]
"""

from __future__ import annotations

import argparse
import pickle
import random
import time

from rl_config.records import Trajectory, Turn, decode, encode


def make_batch(n: int, tokens: int, seed: int = 0) -> list[Trajectory]:
    """``n`` trajectories of ``tokens`` tokens (a 64-token prompt), 5 turns of up to 100 tokens."""
    if tokens < 69:
        raise ValueError(
            f"--tokens must be at least 69 (a 64-token prompt and 5 turns), got {tokens}"
        )
    rng = random.Random(seed)
    width = min(100, (tokens - 64) // 5)
    batch = []
    for i in range(n):
        mask = [False] * 64 + [rng.random() < 0.8 for _ in range(tokens - 64)]
        batch.append(
            Trajectory(
                traj_id=f"t{i}",
                group_id=f"g{i // 8}",
                tag="SimpleSokoban",
                env_seed=i,
                token_ids=[rng.randrange(151_936) for _ in range(tokens)],
                prompt_length=64,
                response_mask=mask,
                rollout_log_probs=[-rng.random() if m else 0.0 for m in mask],
                turns=[
                    Turn(turn_idx=k, start=64 + width * k, end=64 + width * (k + 1))
                    for k in range(5)
                ],
                episode_reward=1.0,
                weight_version=3,
            )
        )
    return batch


def best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trajectories", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    batch = make_batch(args.trajectories, args.tokens)
    packed, pickled = encode(batch), pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
    rows = [
        (
            "encode",
            best_of(lambda: encode(batch), args.repeats),
            best_of(lambda: pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL), args.repeats),
        ),
        (
            "decode+validate",
            best_of(lambda: decode(packed, list[Trajectory]), args.repeats),
            best_of(lambda: pickle.loads(pickled), args.repeats),  # noqa: S301 - our own bytes, the baseline,
        ),
    ]
    print(f"{args.trajectories} trajectories x {args.tokens} tokens")
    print(f"size: msgpack {len(packed) / 1e6:.2f} MB, pickle {len(pickled) / 1e6:.2f} MB")
    print(f"{'op':<16}{'msgspec ms':>12}{'pickle ms':>12}{'pickle/msgspec':>16}")
    for name, ours, base in rows:
        print(f"{name:<16}{ours * 1e3:>12.1f}{base * 1e3:>12.1f}{base / ours:>15.2f}x")


if __name__ == "__main__":
    main()
