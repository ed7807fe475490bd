"""Seconds per DPO step: this stack's rl-train backend against TRL's DPOTrainer, side by side.

    uv run python tools/bench/dpo_step.py --model DIR [--trl-python /tmp/trl-dpo/bin/python]

Same model (tools/bench/char_model.py: Qwen2, hidden 256, 4 layers, ~4.0M parameters, char-level
vocab of 99 tokens; built into DIR when missing), same batch (32 pairs, 128-character prompt and
128-character chosen/rejected = 128 + 128 tokens, plus EOS), sigmoid loss, beta 0.1, reference
log-probs precomputed on both sides, one optimizer step per batch. Ours: rl_train's backend
(`--strategy`, default hf_infer = the single-process path) running rl_train.preference's loss on
the paired layout (chosen and rejected of a pair in one forward). TRL runs in a throw-away venv
(`uv venv /tmp/trl-dpo && uv pip install --python /tmp/trl-dpo/bin/python trl torch==2.13.0`),
never a dependency; without it only our side is measured (said on stdout). The last line is
`median_s_per_step=<ours>`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def make_rows(pairs: int, length: int, seed: int = 0) -> list[dict[str, str]]:
    """Random pairs over the printable ASCII characters except space (one token each)."""
    from char_model import CHARS  # tools/bench/ (the script's dir)

    rng = random.Random(seed)
    alphabet = [c for c in CHARS if c not in " \n"]

    def text() -> str:
        return "".join(rng.choice(alphabet) for _ in range(length))

    return [{"prompt": text(), "chosen": text(), "rejected": text()} for _ in range(pairs)]


def our_batch(rows, tok):
    from rl_runtime.pipelines.dpo.data import Example, collate

    eos = [tok.eos_token_id]
    examples = [
        Example(
            tuple(tok(r["prompt"])["input_ids"]),
            tuple(tok(r["chosen"])["input_ids"] + eos),
            tuple(tok(r["rejected"])["input_ids"] + eos),
        )
        for r in rows
    ]
    return collate(examples, tok.pad_token_id, list(range(len(rows))))


def run_ours(
    model: str, rows, steps: int, warmup: int, strategy: str, share: bool = False
) -> list[float]:
    import torch
    from transformers import AutoTokenizer

    from rl_train.preference import PreferenceLossConfig, sequence_logps
    from rl_train.registry import build_backend

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model)
    batch = our_batch(rows, tok)
    backend = build_backend(
        strategy,
        role="actor",
        model_path=model,
        training_args=dict(
            per_device_train_batch_size=2 * len(rows),
            gradient_accumulation_steps=1,
            learning_rate=1e-6,
            lr_scheduler_type="constant",
            max_steps=steps + warmup,
            infer_batch_size=2 * len(rows),
            share_prompt_forward=share,
        ),
        loss_config=PreferenceLossConfig(loss_type="sigmoid", beta=0.1),
    )
    ref = backend.forward(batch).log_probs
    batch["ref_logps"] = sequence_logps(ref, batch["response_mask"])[0]
    times = []
    for _ in range(steps + warmup):
        t0 = time.perf_counter()
        backend.train_step(dict(batch))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times[warmup:]


def run_trl(python: str, model: str, rows, steps: int, warmup: int) -> dict | str:
    if not Path(python).exists():
        return f"TRL not measured: {python} does not exist (see the module docstring)"
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "pairs.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        cmd = [python, str(Path(__file__).with_name("dpo_trl.py")), "--model", model,
               "--data", str(data), "--steps", str(steps), "--warmup", str(warmup),
               "--pairs", str(len(rows))]  # fmt: skip
        import torch

        if not torch.cuda.is_available():
            cmd.append("--cpu")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        return f"TRL failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model dir (built there when missing)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--pairs", type=int, default=32)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--strategy", default="hf_infer")
    p.add_argument("--trl-python", default="/tmp/trl-dpo/bin/python")
    p.add_argument("--no-trl", action="store_true")
    p.add_argument(
        "--compare-shared",
        action="store_true",
        help="also run ours with share_prompt_forward (each pair's prompt once) in this process "
        "and print the ratio shared/unshared",
    )
    a = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from char_model import build_char_model  # tools/bench/ (the script's dir)

    if not (Path(a.model) / "config.json").exists():
        build_char_model(a.model)
    rows = make_rows(a.pairs, a.length)
    trl = None if a.no_trl else run_trl(a.trl_python, a.model, rows, a.steps, a.warmup)
    ours = run_ours(a.model, rows, a.steps, a.warmup, a.strategy, share=False)
    shared = (
        run_ours(a.model, rows, a.steps, a.warmup, a.strategy, share=True)
        if a.compare_shared
        else None
    )
    import torch

    print(f"device: {'cuda' if torch.cuda.is_available() else 'cpu'} "
          f"threads={torch.get_num_threads()}; {a.pairs} pairs x ({a.length}+{a.length}) tokens")  # fmt: skip
    print(
        f"ours ({a.strategy}): median {statistics.median(ours):.4f} s/step  {[round(t, 4) for t in ours]}"
    )
    if shared is not None:
        print(f"ours with share_prompt_forward: median {statistics.median(shared):.4f} s/step  "
              f"{[round(t, 4) for t in shared]}")  # fmt: skip
        print(f"ratio shared/unshared = {statistics.median(shared) / statistics.median(ours):.3f}")
    if isinstance(trl, dict):
        med = statistics.median(trl["seconds_per_step"])
        print(f"TRL {trl['trl']} DPOTrainer: median {med:.4f} s/step  "
              f"{[round(t, 4) for t in trl['seconds_per_step']]}")  # fmt: skip
        print(f"ratio ours/TRL = {statistics.median(ours) / med:.3f}")
    elif trl is not None:
        print(trl)
    print(f"median_s_per_step={statistics.median(ours):.6f}")


if __name__ == "__main__":
    main()
