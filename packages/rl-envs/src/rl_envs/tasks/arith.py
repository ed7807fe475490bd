"""The CPU default's verifiable tasks, written in verl's parquet schema (data_source
`openai/gsm8k`: graded by the sandboxed GSM8K rule, answer after `####`).

- `max`: `max 3 8 1 5 =` -> `8` (the largest of `num_digits` digits);
- `add`: `a+b=` with a in [0, max_a], b in [0, max_b].

Held-out prompts come from a seeded split of the distinct problems, so no held-out prompt appears
among the training prompts (disjoint by content)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np


def problems(kind: str, *, num_digits: int = 4, max_a: int = 99, max_b: int = 9):
    """Every distinct problem of a task as (prompt text, answer text)."""
    if kind == "max":
        return [(f"max {' '.join(map(str, d))} =", str(max(d)))
                for d in itertools.product(range(10), repeat=num_digits)]  # fmt: skip
    if kind == "add":
        return [(f"{a}+{b}=", str(a + b)) for a in range(max_a + 1) for b in range(max_b + 1)]
    raise ValueError(f"rlvr_app.arith_data.kind={kind!r}: use 'max' or 'add'")


def split(items: list, val_fraction: float, seed: int) -> tuple[list, list]:
    """(train, held-out): a seeded permutation cut in two; every item in exactly one."""
    order = np.random.default_rng(seed).permutation(len(items))
    n_val = round(len(items) * val_fraction)
    if not 0 < n_val < len(items):
        raise ValueError(f"val_fraction={val_fraction} leaves no training or no held-out rows")
    return [items[i] for i in order[n_val:]], [items[i] for i in order[:n_val]]


def row(prompt: str, answer: str, split_name: str, index: int) -> dict:
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": prompt}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split_name, "index": index},
    }


def write_arith_parquet(out_dir: str, *, kind: str, val_fraction: float, seed: int, **sizes):
    """Writes train.parquet and test.parquet under `out_dir`; returns their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    train, val = split(problems(kind, **sizes), val_fraction, seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, items in (("train", train), ("test", val)):
        path = out / f"{name}.parquet"
        pq.write_table(
            pa.Table.from_pylist([row(p, a, name, i) for i, (p, a) in enumerate(items)]), path
        )
        paths.append(str(path))
    return paths[0], paths[1]
