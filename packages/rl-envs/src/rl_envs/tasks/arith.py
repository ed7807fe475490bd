"""The CPU default's verifiable tasks, written in verl's parquet schema (data_source
`openai/gsm8k`: graded by the sandboxed GSM8K rule, answer after `####`).

- `max`: `max 3 8 1 5 =` -> `8` (the largest of `num_digits` digits);
- `add`: `a+b=` with a in [0, max_a], b in [0, max_b].

Held-out prompts are disjoint from the training prompts by content, not only by text: prompts that
are the same problem written differently (`max` with its digits reordered, `a+b=` and `b+a=`)
share a key and fall on one side of the split together, and the held-out side keeps one
prompt per problem, so its prompts are distinct problems (independent for a standard error)."""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

#: (prompt text, answer text, content key): prompts with equal keys are one problem
Problem = tuple[str, str, tuple[int, ...]]


ARITH_KINDS = ("max", "add")
"""The problem kinds `problems` generates."""


def problems(kind: str, *, num_digits: int = 4, max_a: int = 99, max_b: int = 9) -> list[Problem]:
    """Every prompt of a task as (prompt, answer, key); the key names the problem up to how it
    is written: the sorted digits for `max`, the unordered pair of addends for `add`."""
    if kind == "max":
        return [(f"max {' '.join(map(str, d))} =", str(max(d)), tuple(sorted(d)))
                for d in itertools.product(range(10), repeat=num_digits)]  # fmt: skip
    if kind == "add":
        return [(f"{a}+{b}=", str(a + b), (min(a, b), max(a, b)))
                for a in range(max_a + 1) for b in range(max_b + 1)]  # fmt: skip
    raise ValueError(
        f"rlvr_app.arith_data.kind={kind!r}: use {' or '.join(map(repr, ARITH_KINDS))}"
    )


ADDITION = re.compile(r"^\s*(\d+)\s*\+\s*(\d+)\s*=\s*$")
"""An `add` prompt, `a+b=`."""


def sum_without_carry(a: int, b: int) -> int:
    """`a + b` as a pupil who forgets to carry writes it: each column's digit sum mod 10, the
    leading column's sum in full (`47+38` -> 75, `47+68` -> 105, `5+7` -> 12)."""
    out, place = 0, 1
    while a >= 10 or b >= 10:
        out += ((a % 10 + b % 10) % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return out + (a + b) * place


def carry_mistake(question: str) -> str | None:
    """The forgotten-carry answer (`sum_without_carry`) of an `a+b=` question, None for any other
    question or when nothing is carried (the mistake is then the right answer)."""
    m = ADDITION.match(question)
    if m is None:
        return None
    a, b = int(m.group(1)), int(m.group(2))
    wrong = sum_without_carry(a, b)
    return str(wrong) if wrong != a + b else None


def split(items: list[Problem], val_fraction: float, seed: int) -> tuple[list, list]:
    """(train, held-out) by content: a seeded permutation of the distinct problems (keys) cut in
    two, `val_fraction` of them held out. Training gets every prompt of its problems (in a
    seeded order); the held-out side one prompt per problem, picked by the same generator."""
    rng = np.random.default_rng(seed)
    forms: dict[tuple[int, ...], list[Problem]] = defaultdict(list)
    for item in items:
        forms[item[2]].append(item)
    keys = sorted(forms)
    order = rng.permutation(len(keys))
    n_val = round(len(keys) * val_fraction)
    if not 0 < n_val < len(keys):
        raise ValueError(f"val_fraction={val_fraction} leaves no training or no held-out problems")
    held_out = [keys[i] for i in order[:n_val]]
    val_keys = set(held_out)
    train = [items[i] for i in rng.permutation(len(items)) if items[i][2] not in val_keys]
    val = [forms[k][int(rng.integers(len(forms[k])))] for k in held_out]
    return train, val


def row(prompt: str, answer: str, split_name: str, index: int) -> dict:
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": prompt}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split_name, "index": index},
    }


def arith_parquet_paths(out_dir: str) -> tuple[Path, Path]:
    """Where `write_arith_parquet` writes: `out_dir/train.parquet`, `out_dir/test.parquet`."""
    return Path(out_dir) / "train.parquet", Path(out_dir) / "test.parquet"


def write_arith_parquet(out_dir: str, *, kind: str, val_fraction: float, seed: int, **sizes):
    """Writes train.parquet and test.parquet under `out_dir`, each atomically (a run starting
    beside one that is writing reads the old file or the new one, never half of one); returns
    their paths."""
    from rl_envs.tasks.data import write_parquet_rows

    train, val = split(problems(kind, **sizes), val_fraction, seed)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    paths = []
    for path, name, items in zip(arith_parquet_paths(out_dir), ("train", "test"), (train, val)):
        write_parquet_rows(path, [row(p, a, name, i) for i, (p, a, _key) in enumerate(items)])
        paths.append(str(path))
    return paths[0], paths[1]
