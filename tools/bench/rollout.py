"""Rollout benchmarks (one run, ratios against baselines measured in the same process).

1. Engine decode throughput (tokens/s) on the tiny CPU model: HFEngine vs plain
   ``model.generate`` (baseline), and VLLMEngine when vLLM is importable.
2. Agent loop on episodes of mixed lengths (1-6 turns, responses of random length via stop
   tokens, env steps with 0-40 ms latency): env-async vs lockstep (target >= 1.5x).
3. VLLMEngine overhead vs calling vLLM's AsyncLLM directly on the same engine (target >= 0.95x).

Run: ``.venv/bin/python tools/bench/rollout.py`` (HF only) or
``/work/venv-vllm/bin/python tools/bench/rollout.py --engines hf_infer,vllm``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from rl_config.records import GenerationRequest, SamplingParams
from rl_rollout import build_engine
from rl_rollout.agent_loop import AgentLoop, EpisodeSpec
from rl_rollout.tiny_model import build_tiny_model


def _requests(n: int, new_tokens: int, prefix: str = "r") -> list[GenerationRequest]:
    rng = random.Random(0)
    return [
        GenerationRequest(
            request_id=f"{prefix}{i}",
            prompt_ids=[rng.randrange(10, 1000) for _ in range(rng.randrange(16, 64))],
            sampling=SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, seed=i),
        )
        for i in range(n)
    ]


def bench_hf_generate_baseline(model_dir: Path, n: int, new_tokens: int) -> float:
    """Plain transformers ``generate`` on a left-padded batch: tokens/s."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    reqs = _requests(n, new_tokens)
    width = max(len(r.prompt_ids) for r in reqs)
    ids = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for row, r in enumerate(reqs):
        ids[row, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
        mask[row, width - len(r.prompt_ids) :] = 1
    best = 0.0
    for _ in range(2):
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=True,
                pad_token_id=0,
                output_scores=True,
                return_dict_in_generate=True,
            )
        elapsed = time.perf_counter() - start
        produced = (out.sequences.shape[1] - width) * n
        best = max(best, produced / elapsed)
    return best


def bench_engine_tokens_per_s(engine: Any, n: int, new_tokens: int) -> float:
    best = 0.0
    for attempt in range(2):
        reqs = _requests(n, new_tokens, prefix=f"t{attempt}-")
        start = time.perf_counter()
        results = asyncio.run(engine.generate(reqs))
        elapsed = time.perf_counter() - start
        best = max(best, sum(len(r.output_ids) for r in results) / elapsed)
    return best


class LatencyEnv:
    """Wraps an rl_envs env: a fixed number of turns, and a random latency per step drawn from
    U(0, max_latency_s) with its own seeded RNG (like tool calls of varying cost); identical
    draws in both modes."""

    def __init__(self, inner: Any, turns: int, max_latency_s: float, seed: int) -> None:
        self.inner = inner
        self.max_steps = turns
        self.format_penalty = inner.format_penalty
        self.max_latency_s = max_latency_s
        self.rng = random.Random(seed)

    def reset(self, seed=None):
        return self.inner.reset(seed=seed)

    def step(self, action_text):
        time.sleep(self.rng.uniform(0.0, self.max_latency_s))
        obs, reward, _terminated, _truncated, info = self.inner.step(action_text)
        return obs, reward, False, False, info

    def render(self, mode="text"):
        return self.inner.render(mode)

    def system_prompt(self):
        return self.inner.system_prompt()

    def instruction(self):
        return self.inner.instruction()

    def turn_prompt(self, observation, turn_idx, max_response_length):
        return self.inner.turn_prompt(observation, turn_idx, max_response_length)


def _stop_tokens(engine: Any, tokenizer: Any, specs: list[EpisodeSpec], mean_len: int) -> list[int]:
    """The most frequent tokens the model samples in these conversations, up to ~1/mean_len of
    the mass: used as stop tokens they give long-tailed random response lengths."""
    loop = AgentLoop(
        engine, tokenizer, max_tokens_per_step=64, max_turns=2, sampling=SamplingParams(seed=99)
    )
    counts: dict[int, int] = {}
    for traj in asyncio.run(loop.run_episodes(specs)):
        for token, is_model in zip(traj.token_ids, traj.response_mask):
            if is_model:
                counts[token] = counts.get(token, 0) + 1
    total = sum(counts.values())
    chosen, mass = [], 0
    for token, c in sorted(counts.items(), key=lambda kv: -kv[1]):
        if (mass + c) / total > 1.0 / mean_len:
            break
        chosen.append(token)
        mass += c
    return chosen or [max(counts, key=lambda t: counts[t])]


def bench_agent_loop(
    engine: Any, tokenizer: Any, episodes: int, max_tokens: int, max_latency_s: float
) -> dict[str, float]:
    """Same episodes (1-6 turns, per-step env latency U(0, max_latency_s), long-tailed response
    lengths) run
    lockstep and env-async, alternately twice; best tokens/s of each, and the HF engine's
    number of decode steps (a batch-size independent measure of the schedule)."""
    from rl_envs.registry import make_env

    rng = random.Random(0)
    layout = [
        (rng.choice(["SimpleSokoban", "FrozenLake"]), rng.randint(1, 6)) for _ in range(episodes)
    ]

    def specs() -> list[EpisodeSpec]:
        return [
            EpisodeSpec(
                LatencyEnv(make_env(tag), turns, max_latency_s, seed=i),
                seed=i,
                group_id=str(i),
                tag=tag,
            )
            for i, (tag, turns) in enumerate(layout)
        ]

    stop = _stop_tokens(engine, tokenizer, specs(), mean_len=max(2, max_tokens // 4))
    out: dict[str, float] = {}
    lengths: list[int] = []
    for mode in ("lockstep", "async", "lockstep", "async"):
        loop = AgentLoop(
            engine,
            tokenizer,
            max_tokens_per_step=max_tokens,
            max_running_requests=episodes,
            sampling=SamplingParams(seed=1, stop_token_ids=stop),
            mode=mode,  # type: ignore[arg-type]
            env_step_in_thread=True,
        )
        stats = getattr(engine, "stats", None)
        steps_before = stats["decode_steps"] if stats else 0
        start = time.perf_counter()
        trajs = asyncio.run(loop.run_episodes(specs()))
        elapsed = time.perf_counter() - start
        if stats:
            out[f"{mode}_decode_steps"] = float(stats["decode_steps"] - steps_before)
        tokens = sum(sum(t.response_mask) for t in trajs)
        out[mode] = max(out.get(mode, 0.0), tokens / elapsed)
        lengths = [turn.end - turn.start for t in trajs for turn in t.turns]
    out["mean_response"] = statistics.mean(lengths)
    out["capped_fraction"] = sum(n >= max_tokens for n in lengths) / len(lengths)
    return out


def bench_vllm_overhead(
    engine: Any, n: int, new_tokens: int, repeats: int = 5
) -> tuple[float, float]:
    """tokens/s through VLLMEngine.generate vs raw AsyncLLM.generate on the same engine and the
    same sampling parameters (median of alternating repeats)."""
    from vllm.inputs import TokensPrompt

    from rl_rollout.vllm_engine import to_vllm_sampling_params

    async def raw(reqs: list[GenerationRequest]) -> int:
        async def one(req: GenerationRequest) -> int:
            count = 0
            params = to_vllm_sampling_params(req.sampling)
            async for out in engine.llm.generate(
                TokensPrompt(prompt_token_ids=req.prompt_ids), params, req.request_id
            ):
                count += sum(len(c.token_ids) for c in out.outputs)
            return count

        return sum(await asyncio.gather(*(one(r) for r in reqs)))

    def run_raw(i: int) -> None:
        reqs = _requests(n, new_tokens, prefix=f"raw{i}-")
        start = time.perf_counter()
        produced = engine._call(raw(reqs))
        theirs.append(produced / (time.perf_counter() - start))

    def run_ours(i: int) -> None:
        reqs = _requests(n, new_tokens, prefix=f"ours{i}-")
        start = time.perf_counter()
        results = asyncio.run(engine.generate(reqs))
        ours.append(sum(len(r.output_ids) for r in results) / (time.perf_counter() - start))

    ours: list[float] = []
    theirs: list[float] = []
    run_raw(-1)  # warm the prefix cache for these prompts once, for both paths alike
    for i in range(repeats):  # alternate the order so drift in machine load does not bias one
        first, second = (run_raw, run_ours) if i % 2 == 0 else (run_ours, run_raw)
        first(i)
        second(i)
    return statistics.median(ours), statistics.median(theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engines", default="hf_infer", help="comma list: hf_infer,vllm")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--max-tokens-per-step", type=int, default=48)
    parser.add_argument("--model-dir", default=None)
    parser.add_argument(
        "--sections", default="engine,agent,overhead", help="comma list: engine,agent,overhead"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    model_dir = Path(args.model_dir or Path(tempfile.gettempdir()) / "rl-bench-tiny-qwen2")
    build_tiny_model(model_dir, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows: list[tuple[str, str, str]] = []

    sections = set(args.sections.split(","))
    base = 1.0
    if "engine" in sections:
        base = bench_hf_generate_baseline(model_dir, args.batch, args.new_tokens)
        rows.append(("transformers model.generate (baseline)", f"{base:,.0f} tok/s", "1.00x"))
    for name in args.engines.split(","):
        config = (
            {"max_num_seqs": 64}
            if name == "hf_infer"
            else {"max_num_seqs": 64, "max_model_len": 1024}
        )
        engine = build_engine(name, model_dir, config, dtype="float32", device="cpu", seed=0)
        try:
            if "engine" in sections:
                tps = bench_engine_tokens_per_s(engine, args.batch, args.new_tokens)
                rows.append(
                    (
                        f"{name} engine, {args.batch} x {args.new_tokens} tokens",
                        f"{tps:,.0f} tok/s",
                        f"{tps / base:.2f}x vs generate",
                    )
                )
            for label, latency in (
                ("game envs, 0-40 ms steps", 0.04),
                ("tool-like envs, 0-250 ms steps", 0.25),
            ):
                if "agent" not in sections:
                    break
                agent = bench_agent_loop(
                    engine, tokenizer, args.episodes, args.max_tokens_per_step, latency
                )
                steps = ""
                if "async_decode_steps" in agent:
                    steps = (
                        f"; decode steps {agent['lockstep_decode_steps']:.0f} -> "
                        f"{agent['async_decode_steps']:.0f} "
                        f"({agent['lockstep_decode_steps'] / agent['async_decode_steps']:.2f}x fewer)"
                    )
                rows.append(
                    (
                        f"{name} agent loop lockstep ({args.episodes} mixed episodes, {label})",
                        f"{agent['lockstep']:,.0f} tok/s",
                        "1.00x",
                    )
                )
                rows.append(
                    (
                        f"{name} agent loop env-async ({label})",
                        f"{agent['async']:,.0f} tok/s",
                        f"{agent['async'] / agent['lockstep']:.2f}x vs lockstep{steps}",
                    )
                )
                print(
                    f"[{name}] {label}: responses mean {agent['mean_response']:.1f} tokens, "
                    f"{agent['capped_fraction']:.0%} hit max_tokens_per_step="
                    f"{args.max_tokens_per_step}"
                )
            if name == "vllm" and "overhead" in sections:
                ours, raw = bench_vllm_overhead(engine, 2 * args.batch, 2 * args.new_tokens)
                shape = f"{2 * args.batch} x {2 * args.new_tokens} tokens"
                rows.append((f"raw vLLM AsyncLLM.generate, {shape}", f"{raw:,.0f} tok/s", "1.00x"))
                rows.append(
                    (
                        f"VLLMEngine.generate, {shape}",
                        f"{ours:,.0f} tok/s",
                        f"{ours / raw:.2f}x vs raw (target >= 0.95x)",
                    )
                )
        finally:
            engine.shutdown()

    print(
        f"\nrollout benchmarks (CPU, {torch.get_num_threads()} torch thread(s), python {sys.version.split()[0]})\n"
    )
    print("| benchmark | throughput | ratio |")
    print("|---|---|---|")
    for row in rows:
        print(f"| {row[0]} | {row[1]} | {row[2]} |")


if __name__ == "__main__":
    main()
