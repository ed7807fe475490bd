"""Plain vs shared-prompt forward (`share_prompt_forward`, rl_train.shared_prefix) on one micro-batch:
one training micro-step (forward + backward of a loss on the response log-probs) and one no-grad
log-prob forward, in the same process, the two taking turns (the order alternates each repeat) so
load from other processes on the machine hits both alike. fp32 on the CPU, sdpa,
`torch.set_num_threads(--threads)`.

Shapes (`--shape`, default both):
* `rlvr_cpu`: apps/rlvr's CPU default: its tiny Qwen2 (hidden 128, 2 layers, 2 heads, 1 KV head,
  intermediate 256, vocab 1024), 4 prompts of 34 tokens x 8 samples = 32 rows, responses of 6-10
  tokens, activation checkpointing on (the app's default until 2026-11-23; now off);
* `grpo_step`: tools/bench/grpo_step.py's step: its character model (hidden 256, 4 layers, 4 heads,
  2 KV heads, intermediate 1024), 16 prompts of 22-32 tokens x 4 samples = 64 rows, 128 response
  tokens, no activation checkpointing (rl-train's default);
* `rlvr_cpu_distinct`: as `rlvr_cpu` with 32 different prompts (nothing to share: the cost of the
  second pass alone).

    uv run python tools/bench/shared_prompt.py [--shape rlvr_cpu] [--repeats 15] [--threads 1]

Prints, per shape and phase, the median seconds of each path and the ratio plain / shared (of the
medians, and the median of the per-repeat ratios); `--json` writes every timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from char_model import build_char_model  # tools/bench/ (the script's dir)


@dataclass(frozen=True)
class Shape:
    rows_per_prompt: int
    prompts: int
    prompt_len: tuple[int, int]  # inclusive range
    response_len: tuple[int, int]
    checkpointing: bool
    model: str  # "rlvr_tiny" | "char"


SHAPES = {
    "rlvr_cpu": Shape(8, 4, (34, 34), (6, 10), True, "rlvr_tiny"),
    "grpo_step": Shape(4, 16, (22, 32), (128, 128), False, "char"),
    # the worst case: no prompt shared (e.g. apps/rlvr's supervised warm-up batches)
    "rlvr_cpu_distinct": Shape(1, 32, (34, 34), (6, 10), True, "rlvr_tiny"),
}


def build_model_dir(kind: str, root: Path) -> Path:
    if kind == "char":
        return build_char_model(root / "char")
    from rl_rollout.tiny_model import build_tiny_model

    # apps/rlvr/configs/cpu_default.yaml's rlvr_app.tiny_model
    return build_tiny_model(
        root / "rlvr_tiny",
        hidden_size=128,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=256,
        seed=0,
    )


def make_batch(shape: Shape, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """Right-padded rows (rl_train.testing.rows_batch): `shape.prompts` random prompts, each followed by `rows_per_prompt`
    random responses."""
    from rl_train.testing import rows_batch

    g = torch.Generator().manual_seed(seed)

    def length(lo_hi: tuple[int, int]) -> int:
        return int(torch.randint(lo_hi[0], lo_hi[1] + 1, (1,), generator=g))

    rows = []
    for _ in range(shape.prompts):
        prompt = torch.randint(3, vocab, (length(shape.prompt_len),), generator=g)
        for _ in range(shape.rows_per_prompt):
            response = torch.randint(3, vocab, (length(shape.response_len),), generator=g)
            rows.append((prompt.tolist(), response.tolist()))
    return rows_batch(rows, extra_pad=0)


def timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_shape(name: str, shape: Shape, root: Path, args: argparse.Namespace) -> dict:
    from rl_train.args import ModelArgs
    from rl_train.modeling import enable_gradient_checkpointing, load_model, token_outputs

    model = load_model(
        build_model_dir(shape.model, root), "actor", ModelArgs(attn_implementation="sdpa")
    )
    if shape.checkpointing:
        enable_gradient_checkpointing(model)
    vocab = int(getattr(model.config, "vocab_size"))  # noqa: B009
    batch = make_batch(shape, vocab, args.seed)
    mask = batch["response_mask"]

    def train(share: bool) -> Callable[[], None]:
        def run() -> None:
            model.train()
            model.zero_grad(set_to_none=True)
            out = token_outputs(model, batch, role="actor", need_entropy=True, share_prompt=share)
            assert out.log_probs is not None
            (-(out.log_probs * mask).sum() / mask.sum()).backward()

        return run

    def forward(share: bool) -> Callable[[], None]:
        def run() -> None:
            model.eval()
            with torch.no_grad():
                token_outputs(model, batch, role="reference", share_prompt=share)

        return run

    result: dict = {
        "rows": int(mask.shape[0]),
        "prompt_tokens_per_row": float(
            (batch["attention_mask"].sum(1) - mask.sum(1)).float().mean()
        ),
        "response_tokens_per_row": float(mask.sum(1).float().mean()),
    }
    for phase, make in (("train_micro_step", train), ("logprob_forward", forward)):
        for share in (False, True):  # warm-up
            make(share)()
        plain, shared = [], []
        for i in range(args.repeats):
            order = (False, True) if i % 2 == 0 else (True, False)
            for share in order:
                (shared if share else plain).append(timed(make(share)))
        ratios = [p / s for p, s in zip(plain, shared, strict=True)]
        result[phase] = {
            "plain_s": plain,
            "shared_s": shared,
            "median_plain_s": statistics.median(plain),
            "median_shared_s": statistics.median(shared),
            "ratio_of_medians": statistics.median(plain) / statistics.median(shared),
            "median_ratio": statistics.median(ratios),
        }
    print(
        f"{name}: {result['rows']} rows, prompt {result['prompt_tokens_per_row']:.1f} + response "
        f"{result['response_tokens_per_row']:.1f} tokens per row, checkpointing "
        f"{'on' if shape.checkpointing else 'off'}"
    )
    for phase in ("train_micro_step", "logprob_forward"):
        r = result[phase]
        print(
            f"  {phase:<17} plain {r['median_plain_s'] * 1e3:8.1f} ms  shared "
            f"{r['median_shared_s'] * 1e3:8.1f} ms  plain/shared {r['ratio_of_medians']:.2f} "
            f"(median of per-repeat ratios {r['median_ratio']:.2f})",
            flush=True,
        )
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), action="append", default=None)
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats per path")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", type=Path, default=None, help="model cache dir (default: tmp)")
    parser.add_argument("--json", type=Path, default=None, help="write every timing here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = args.models or Path(tmp)
        for name in args.shape or list(SHAPES):
            results[name] = bench_shape(name, SHAPES[name], root, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
