"""The CPU default's supervised data: a locally made arithmetic dataset with both row kinds.

Half the rows are prompt/response rows (`instruction` "add A and B", `output` "A + B = C"),
half are two-turn chat rows (`messages`: the same question and answer, then "and plus 1?"
answered "C + 1 = D"), so the default trains on ROLL's rows and on multi-turn masking at once.
A, B run over 0..99; held-out rows use (A, B) pairs never in training."""

from __future__ import annotations

import json
import random
from pathlib import Path


def _row(a: int, b: int, chat: bool) -> dict:
    c = a + b
    if not chat:
        return {"instruction": f"add {a} and {b}", "output": f"{a} + {b} = {c}"}
    return {
        "messages": [
            {"role": "user", "content": f"add {a} and {b}"},
            {"role": "assistant", "content": f"{a} + {b} = {c}"},
            {"role": "user", "content": "and plus 1?"},
            {"role": "assistant", "content": f"{c} + 1 = {c + 1}"},
        ]
    }


def write_rows(train_path: str, eval_path: str, train_rows: int, eval_rows: int, seed: int) -> None:
    """JSONL files of `train_rows` and `eval_rows` rows; the same files for the same arguments."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(100) for b in range(100)]
    rng.shuffle(pairs)
    if train_rows + eval_rows > len(pairs):
        raise ValueError(f"at most {len(pairs)} rows (train_rows + eval_rows)")
    held, train = pairs[:eval_rows], pairs[eval_rows : eval_rows + train_rows]
    for path, rows in ((eval_path, held), (train_path, train)):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            for i, (a, b) in enumerate(rows):
                f.write(json.dumps(_row(a, b, chat=i % 2 == 1)) + "\n")
