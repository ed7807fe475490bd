"""Benchmarks of rl-envs: level generation, env steps/s, sandboxed reward call overhead.

Run: .venv/bin/python tools/bench/envs.py [--quick]
Every number is measured in this process; the sandbox overhead is reported against an in-process
call of the same function (the baseline).
"""

from __future__ import annotations

import argparse
import statistics
import time

from rl_envs import make_env
from rl_envs.frozen_lake import generate_frozen_lake
from rl_envs.rewards import MATH_PRELOAD, MATH_WARMUP
from rl_envs.rewards.graders import gsm8k_score, math_score
from rl_envs.sandbox import SandboxLimits, SandboxPool
from rl_envs.sokoban import generate_sokoban

SOKOBAN_VARIANTS = {
    "SimpleSokoban": {"dim_room": (6, 6), "num_boxes": 1, "search_depth": 30},
    "LargerSokoban": {"dim_room": (8, 8), "num_boxes": 2, "search_depth": 10},
    "SokobanDifferentGridVocab": {"dim_room": (6, 6), "num_boxes": 1, "search_depth": 30},
}


def _rate(fn, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - start)


def bench_generation(n: int) -> list[tuple[str, float]]:
    rows = [
        (name, _rate(lambda s, c=cfg: generate_sokoban(s, **c), n))
        for name, cfg in SOKOBAN_VARIANTS.items()
    ]
    rows.append(("FrozenLake 4x4", _rate(lambda s: generate_frozen_lake(s, size=4), n)))
    rows.append(("FrozenLake 8x8", _rate(lambda s: generate_frozen_lake(s, size=8), n)))
    return rows


def bench_steps(n: int) -> list[tuple[str, float]]:
    out = []
    actions = [
        "<answer>Up</answer>",
        "<answer>Left</answer>",
        "<answer>Down</answer>",
        "<answer>Right</answer>",
    ]
    for tag in ("SimpleSokoban", "LargerSokoban", "FrozenLake", "FrozenLakeThink"):
        env = make_env(tag, max_steps=10**9)
        env.reset(seed=0)
        if tag == "FrozenLakeThink":
            actions_t = [f"<think>t</think><answer>{a[8:-9]}</answer>" for a in actions]
        else:
            actions_t = actions
        count = 0
        start = time.perf_counter()
        while count < n:
            _, _, terminated, truncated, _ = env.step(actions_t[count % 4])
            count += 1
            if terminated or truncated:
                env.reset(seed=count)
        out.append((tag, count / (time.perf_counter() - start)))
    return out


def _latencies(fn, n: int) -> tuple[float, float]:
    times = []
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    times.sort()
    return statistics.median(times) * 1e3, times[int(0.9 * (len(times) - 1))] * 1e3


def bench_sandbox(n: int) -> list[tuple[str, float, float, float]]:
    rows = []
    with SandboxPool(1, limits=SandboxLimits(timeout_s=10)) as pool:
        pool.call("math:sqrt", 1.0)
        base = _latencies(lambda i: gsm8k_score(f"#### {i}", str(i)), n)
        rows.append(("gsm8k_score in-process (baseline)", *base, 1.0))
        sand = _latencies(
            lambda i: pool.call("rl_envs.rewards.graders:gsm8k_score", f"#### {i}", str(i)), n
        )
        rows.append(("gsm8k_score sandboxed (warm pool)", *sand, sand[0] / max(base[0], 1e-6)))
        each = _per_response(pool, "rl_envs.rewards.graders:gsm8k_score", _gsm8k_args, n)
        rows.append((f"gsm8k_score sandboxed, {BATCH} per call", *each, each[0] / base[0]))
        src = "def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return float(solution_str == ground_truth)\n"
        custom = _latencies(
            lambda i: pool.call_source(src, "compute_score", ["d", str(i), str(i), {}]), n
        )
        rows.append(("custom reward file sandboxed", *custom, custom[0] / max(base[0], 1e-6)))
    with SandboxPool(
        1, limits=SandboxLimits(timeout_s=10), preload=MATH_PRELOAD, warmup=MATH_WARMUP
    ) as pool:
        base = _latencies(lambda i: math_score(rf"\boxed{{\frac{{{i}}}{{2}}}}", str(i / 2)), n // 2)
        rows.append(("math_score in-process (baseline)", *base, 1.0))
        sand = _latencies(
            lambda i: pool.call(
                "rl_envs.rewards.graders:math_score", rf"\boxed{{\frac{{{i}}}{{2}}}}", str(i / 2)
            ),
            n // 2,
        )
        rows.append(("math_score sandboxed (warm pool)", *sand, sand[0] / max(base[0], 1e-6)))
        each = _per_response(pool, "rl_envs.rewards.graders:math_score", _math_args, n // 2)
        rows.append((f"math_score sandboxed, {BATCH} per call", *each, each[0] / base[0]))
    return rows


BATCH = 64  # responses per sandbox call (SandboxPool.call_each, as RewardManager batches)


def _gsm8k_args(i: int) -> list:
    return [f"#### {i}", str(i)]


def _math_args(i: int) -> list:
    return [rf"\boxed{{\frac{{{i}}}{{2}}}}", str(i / 2)]


def _per_response(pool: SandboxPool, target: str, args, n: int) -> tuple[float, float]:
    """Median and p90 ms per response when ``BATCH`` responses share one sandbox call."""
    calls = [(args(i), {}) for i in range(BATCH)]
    median, p90 = _latencies(lambda i: pool.call_each(target, calls), max(n // BATCH, 5))
    return median / BATCH, p90 / BATCH


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n_gen, n_steps, n_calls = (100, 5_000, 40) if args.quick else (500, 50_000, 200)
    print("## Level generation (levels/s)\n\n| generator | levels/s |\n|---|---|")
    for name, rate in bench_generation(n_gen):
        print(f"| {name} | {rate:,.0f} |")
    print("\n## Env steps (single thread, text observation)\n\n| env | steps/s |\n|---|---|")
    for name, rate in bench_steps(n_steps):
        print(f"| {name} | {rate:,.0f} |")
    print("\n## Reward calls (target: sandboxed <= 20 ms per call)\n")
    print("| call | median ms | p90 ms | median vs in-process |\n|---|---|---|---|")
    for name, median, p90, ratio in bench_sandbox(n_calls):
        print(f"| {name} | {median:.2f} | {p90:.2f} | {ratio:.1f}x |")


if __name__ == "__main__":
    main()
