"""The CPU default's verifiable task: `a+b=` with a in [0, max_a], b in [0, max_b], written in
verl's parquet schema (data_source `openai/gsm8k`: graded by the sandboxed GSM8K rule, answer
after `####`). Held-out pairs are chosen by a seeded split of the distinct (a, b) pairs, so no
held-out prompt appears among the training prompts (disjoint by content)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def pairs_split(max_a: int, max_b: int, val_fraction: float, seed: int):
    """(train pairs, held-out pairs), disjoint, every pair in exactly one."""
    pairs = [(a, b) for a in range(max_a + 1) for b in range(max_b + 1)]
    order = np.random.default_rng(seed).permutation(len(pairs))
    n_val = int(round(len(pairs) * val_fraction))
    if not 0 < n_val < len(pairs):
        raise ValueError(f"val_fraction={val_fraction} leaves no training or no held-out pairs")
    val = [pairs[i] for i in order[:n_val]]
    train = [pairs[i] for i in order[n_val:]]
    return train, val


def row(a: int, b: int, split: str, index: int) -> dict:
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"{a}+{b}="}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"split": split, "index": index},
    }


def write_arith_parquet(out_dir: str, *, max_a: int, max_b: int, val_fraction: float, seed: int):
    """Writes train.parquet and test.parquet under `out_dir`; returns their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    train, val = pairs_split(max_a, max_b, val_fraction, seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, pairs in (("train", train), ("test", val)):
        rows = [row(a, b, name, i) for i, (a, b) in enumerate(pairs)]
        path = out / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        paths.append(str(path))
    return paths[0], paths[1]
