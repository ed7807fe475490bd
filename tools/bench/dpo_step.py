"""Seconds per DPO step: this stack's rl-train backend against TRL's DPOTrainer, side by side.

    uv run python tools/bench/dpo_step.py --model DIR [--trl-python /tmp/trl-dpo/bin/python]

Same model (tools/bench/char_model.py: Qwen2, hidden 256, 4 layers, ~4.0M parameters, char-level
vocab of 99 tokens; built into DIR when missing), same batch (32 pairs, 128-character prompt and
128-character chosen/rejected = 128 + 128 tokens, plus EOS), sigmoid loss, beta 0.1, reference
log-probs precomputed on both sides, one optimizer step per batch. Ours: rl_train's backend
(`--strategy`, default hf_infer = the single-process path) running rl_train.preference's loss on
the paired layout (chosen and rejected of a pair in one forward). TRL runs in a throw-away venv
(`uv venv /tmp/trl-dpo && uv pip install --python /tmp/trl-dpo/bin/python trl torch==2.13.0`),
never a dependency; without it only our side is measured (said on stdout). `--compare-shared`
also runs ours with `share_prompt_forward` (each pair's prompt once, rl_train.shared_prefix; the
same loss). Each side is printed against the arithmetic floor of its step (`step_gflop` at the
GEMM rate measured in the run; unshared for TRL). The last line is `median_s_per_step=<ours>`.

Measured 2026-11-29 12:50-12:58 on the quiet 2-core Intel Xeon, `--model /tmp/rl-bench-dpo-model
--compare-shared`, TRL 1.16 in a throw-away venv, 10 steps a side (one invocation each):
- TRL on this workspace's torch 2.13.0 / transformers 5.19.0 (`--trl-python /tmp/trl213/bin/python`,
  see tools/bench/grpo_step.py): ours 2.571 s/step, shared 1.705, TRL 3.306; ours/TRL **0.778**,
  shared/TRL **0.516**.
- TRL on its own newer torch 2.15.0 (`uv pip install trl`): ours 2.326, shared 1.639, TRL 3.408;
  ours/TRL 0.682, shared/TRL **0.481**.
Then five invocations on TRL's same-torch venv (13:32-13:43, quiet): shared/TRL 0.536, 0.486,
0.523, 0.548, 0.471, **median 0.523** (the target, 0.5, not met); ours/TRL unshared 0.688, 0.750,
0.702, 0.718, 0.708, median 0.708; shared/unshared 0.65-0.78.
The floors (415 GFLOP unshared, 316 GFLOP shared, at ~330 GFLOP/s): 1.26 s and 0.96 s; shared
runs at ~1.8x its floor, TRL at ~2.6x its own. In the shared step's profile (torch.profiler, one
step, 1.85 s self CPU) the matrix products take 0.98 s (the floor's GEMM time), attention 0.25 s
and elementwise multiplies 0.22 s (norms, rotary, SwiGLU and their backward): what is left to
take is the elementwise work, which eager PyTorch runs one kernel per op.
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

if __package__:  # imported as tools.bench.dpo_step (tests)
    from .grpo_step import gemm_gflops, model_arithmetic
else:  # run as a script: its folder is the first import path
    from grpo_step import gemm_gflops, model_arithmetic


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


def step_gflop(model_dir: str, pairs: int, prompt: int, response: int, *, shared: bool) -> float:
    """The matrix products one DPO step cannot avoid, in GFLOP (tools/bench/grpo_step.py's
    `step_gflop` counts the same way: 2 FLOP per multiply-add, a backward twice its forward,
    causal attention over the real tokens, logits at the response positions; elementwise work
    left out, so a lower bound). Unshared, as TRL runs it: each pair's prompt + chosen and
    prompt + rejected, `prompt + response` tokens each. `shared` (share_prompt_forward): the
    prompt less its last token once per pair, then each response with that last token."""
    linear, head, layers, width = model_arithmetic(model_dir)
    rows = 2 * pairs
    if shared:
        prefix, rest = prompt - 1, response + 1
        fed = pairs * prefix + rows * rest
        contexts = pairs * prefix * (prefix + 1) / 2 + rows * sum(
            prefix + j for j in range(1, rest + 1)
        )
    else:
        length = prompt + response
        fed = rows * length
        contexts = rows * length * (length + 1) / 2
    forward = 2 * linear * fed + 4 * layers * width * contexts + 2 * head * rows * response
    return 3 * forward / 1e9


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
    from transformers import AutoConfig

    print(f"device: {'cuda' if torch.cuda.is_available() else 'cpu'} "
          f"threads={torch.get_num_threads()}; {a.pairs} pairs x ({a.length}+{a.length}) tokens")  # fmt: skip
    config = AutoConfig.from_pretrained(a.model)
    rate = gemm_gflops(config.hidden_size, config.intermediate_size, torch.get_num_threads())
    response = a.length + 1  # the EOS after each response
    floors = {
        share: step_gflop(a.model, a.pairs, a.length, response, shared=share) / rate
        for share in (False, True)
    }
    print(f"arithmetic floor at the measured GEMM rate ({rate:.0f} GFLOP/s): unshared (as TRL) "
          f"{floors[False]:.3f} s, prompt shared {floors[True]:.3f} s")  # fmt: skip
    sides = [(f"ours ({a.strategy})", ours, floors[False])]
    if shared is not None:
        sides.append(("ours with share_prompt_forward", shared, floors[True]))
    if isinstance(trl, dict):
        sides.append((f"TRL {trl['trl']} DPOTrainer", trl["seconds_per_step"], floors[False]))
    elif trl is not None:
        print(trl)
    for name, times, floor in sides:
        med = statistics.median(times)
        print(f"{name}: median {med:.4f} s/step ({med / floor:.2f}x its floor)  "
              f"{[round(t, 4) for t in times]}")  # fmt: skip
    if shared is not None:
        print(f"ratio shared/unshared = {statistics.median(shared) / statistics.median(ours):.3f}")
    if isinstance(trl, dict):
        med = statistics.median(trl["seconds_per_step"])
        print(f"ratio ours/TRL = {statistics.median(ours) / med:.3f}")
        if shared is not None:
            print(f"ratio ours (share_prompt_forward)/TRL = {statistics.median(shared) / med:.3f}")
    print(f"median_s_per_step={statistics.median(ours):.6f}")


if __name__ == "__main__":
    main()
