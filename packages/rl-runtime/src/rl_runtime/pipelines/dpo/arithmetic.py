"""The CPU default's preference data and its check: 'What is the last digit of A+1?' with the
correct digit chosen and a wrong digit rejected. A runs over 10..9999; the held-out prompts use
numbers A that never occur in training (disjoint by content), while A's last digit recurs, so
the preference is learnable by a tiny model within minutes and checkable. (The harder 'last
digit of A+B' was not learned by the 2-layer tiny model in 200 DPO steps: measured, see docs/dpo.md.)"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import torch


def prompt_text(a: int) -> str:
    return f"What is the last digit of {a}+1?"


def write_pairs(
    train_path: str, eval_path: str, train_rows: int, eval_rows: int, seed: int
) -> None:
    """JSONL rows {prompt, chosen, rejected, answer}; the same files for the same arguments."""
    rng = random.Random(seed)
    numbers = list(range(10, 10_000))
    rng.shuffle(numbers)
    held, train = numbers[:eval_rows], numbers[eval_rows : eval_rows + train_rows]
    for path, rows in ((eval_path, held), (train_path, train)):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            for a in rows:
                answer = (a + 1) % 10
                wrong = rng.choice([d for d in range(10) if d != answer])
                row = {"prompt": prompt_text(a), "chosen": str(answer), "rejected": str(wrong)}
                f.write(json.dumps({**row, "answer": answer}) + "\n")


def greedy_correct(model_path: str, named_tensors: list, examples: list, eos_id: int) -> float:
    """Share of `examples` (with meta `answer`) whose greedy 2-token answer starts with the right
    digit, decoded by a local copy of the policy holding `named_tensors` (HF names)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    missing, unexpected = model.load_state_dict(dict(named_tensors), strict=False)
    if unexpected or any("lm_head" not in k for k in missing):
        raise RuntimeError(f"policy weights do not fit the model: {missing[:3]} {unexpected[:3]}")
    model.tie_weights()
    tok = AutoTokenizer.from_pretrained(model_path)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos_id
    width = max(len(e.prompt) for e in examples)
    ids = torch.full((len(examples), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(examples):  # left padding for generation
        ids[i, width - len(e.prompt) :] = torch.tensor(e.prompt)
        mask[i, width - len(e.prompt) :] = 1
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=2, do_sample=False,
            pad_token_id=pad, eos_token_id=eos_id,
        )  # fmt: skip
    texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
    hits = 0
    for text, e in zip(texts, examples):
        m = re.match(r"\s*(\d)", text)  # model output is only parsed, never evaluated
        hits += int(m is not None and int(m.group(1)) == int(e.meta["answer"]))
    return hits / max(1, len(examples))
