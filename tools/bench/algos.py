"""rl-algos benchmarks (one CPU thread, every ratio measured against a baseline in the same run).

Run: ``.venv/bin/python tools/bench/algos.py [--quick]``

1. ``gae`` at B=64, T=4096 vs (a) the usual reverse loop over T vectorised over B (verl/ROLL style)
   and (b) a plain Python loop over T and B; results must agree within 1e-5.
2. Group estimators at N=8192 rows, T=512 (groups of 8, rows of a prompt adjacent as rollouts emit
   them, and again with the rows shuffled) vs one fused pass that reads ``scores`` and the mask and
   writes the advantages — the memory-bound floor of any estimator (the faster of
   ``scores[:, None] * mask`` and ``torch.where(mask, scores[:, None], 0)``).  Each estimator is timed
   back to back with both floors, in rotating order, in each of 21 rounds; the median per-round
   ratio is reported with its spread (p25..p75 and max).  glibc is asked to keep freed memory
   (``mallopt``) so that random page-fault storms on re-allocating the [N, T] output do not land
   on either side.
3. Chunked log-prob + entropy at N=4096 tokens, V=151936 (bf16 logits, as a model emits them) vs the
   naive float32 path.  Peak extra memory is measured honestly as the growth of the process's peak
   RSS (``ru_maxrss``) while the variant runs, each variant in a fresh subprocess whose inputs are
   created without transient copies (torch's CPU allocator has no peak-memory statistics; RSS is
   what the OS charges).  Time is measured in this process, best of a few runs.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

torch.set_num_threads(1)

from rl_algos import advantages as A  # noqa: E402
from rl_algos.logprobs import (  # noqa: E402
    entropy_from_logits,
    log_probs_from_logits,
    log_probs_from_logits_chunked,
)


def keep_freed_memory() -> bool:
    """Ask glibc not to unmap or trim freed memory (``mallopt``), as a long-running trainer's heap
    behaves.  Without it a freed ``[N, T]`` output is sometimes returned to the OS and the next
    allocation of either side pays thousands of page faults (~7 ms, more than the work itself) at
    random; with it both the baseline and the estimators measure compute.  False if not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(
            libc.mallopt(m_trim_threshold, 1 << 30) and libc.mallopt(m_mmap_threshold, 1 << 30)
        )
    except (OSError, AttributeError):
        return False


def best_time(fn: Callable[[], object], repeat: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


# --------------------------------------------------------------------------- 1. GAE


def gae_loop_over_t(rewards, values, mask, gamma, lam):
    """The common implementation: reverse loop over T, vectorised over B, skipping masked tokens."""
    b, t = rewards.shape
    m = mask.to(rewards.dtype)
    next_v = torch.zeros(b)
    last = torch.zeros(b)
    out = torch.zeros(b, t)
    for j in reversed(range(t)):
        delta = rewards[:, j] + gamma * next_v - values[:, j]
        new_last = delta + gamma * lam * last
        next_v = values[:, j] * m[:, j] + (1 - m[:, j]) * next_v
        last = new_last * m[:, j] + (1 - m[:, j]) * last
        out[:, j] = last
    return out * m


def gae_python_loop(rewards, values, mask, gamma, lam):
    r, v, m = rewards.tolist(), values.tolist(), mask.tolist()
    out = []
    for rr, vv, mm in zip(r, v, m):
        row = [0.0] * len(rr)
        last = next_v = 0.0
        for j in range(len(rr) - 1, -1, -1):
            if mm[j]:
                last = rr[j] + gamma * next_v - vv[j] + gamma * lam * last
                next_v = vv[j]
                row[j] = last
        out.append(row)
    return torch.tensor(out)


def bench_gae(b: int, t: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(b, t, generator=g), torch.randn(b, t, generator=g)
    pos = torch.arange(t)
    prompt = torch.randint(0, t // 4, (b, 1), generator=g)
    length = torch.randint(t // 4, t // 2, (b, 1), generator=g)
    mask = (pos >= prompt) & (pos < prompt + length)  # right padding, varied lengths
    gamma, lam = 0.99, 0.95
    ours, _ = A.gae(rewards, values, mask, gamma, lam)
    ref_t = gae_loop_over_t(rewards, values, mask, gamma, lam)
    ref_py = gae_python_loop(rewards, values, mask, gamma, lam)
    err_t = (ours - ref_t).abs().max().item()
    err_py = (ours - ref_py).abs().max().item()
    t_ours = best_time(lambda: A.gae(rewards, values, mask, gamma, lam), repeat=7)
    t_loop = best_time(lambda: gae_loop_over_t(rewards, values, mask, gamma, lam), repeat=3)
    t_py = best_time(lambda: gae_python_loop(rewards, values, mask, gamma, lam), repeat=1, warmup=0)
    return [
        {
            "case": f"gae B={b} T={t}",
            "baseline": "loop over T (vectorised over B)",
            "ours_ms": t_ours * 1e3,
            "baseline_ms": t_loop * 1e3,
            "speedup": t_loop / t_ours,
            "max_abs_err": err_t,
            "target": ">=100x",
        },
        {
            "case": f"gae B={b} T={t}",
            "baseline": "Python loop over T and B",
            "ours_ms": t_ours * 1e3,
            "baseline_ms": t_py * 1e3,
            "speedup": t_py / t_ours,
            "max_abs_err": err_py,
            "target": ">=100x",
        },
    ]


# --------------------------------------------------------------------------- 2. group estimators


def bench_groups(
    n: int, t: int, group_size: int = 8, rounds: int = 21, shuffled: bool = False
) -> list[dict]:
    """Each estimator vs the fastest fused pass that reads ``scores`` and the mask and writes the
    ``[N, T]`` float advantages.  Both floors are timed (``scores[:, None] * mask`` and
    ``torch.where(mask, scores[:, None], 0)``) and the faster one each round is the baseline.

    Noise-robust on a shared CPU: in each of ``rounds`` rounds every estimator is timed (best of 3)
    back to back with both floors, in a rotating order; the ratio is taken against those adjacent
    floor timings, and the median ratio over rounds is reported with its spread (p25..p75, max).
    """
    g = torch.Generator().manual_seed(1)
    scores = torch.randint(0, 2, (n,), generator=g).float()
    index = torch.arange(n) // group_size  # rollout layout: the samples of a prompt adjacent
    if shuffled:  # same groups, rows in random order: the general scatter/gather path
        index = index[torch.randperm(n, generator=g)]
    lengths = torch.randint(1, t + 1, (n, 1), generator=g)
    mask = torch.arange(t) < lengths
    zero = torch.zeros((), dtype=scores.dtype)
    floors: dict[str, Callable[[], object]] = {
        "mul": lambda: scores.unsqueeze(-1) * mask,
        "where": lambda: torch.where(mask, scores.unsqueeze(-1), zero),
    }
    cases: dict[str, Callable[[], object]] = {
        "grpo": lambda: A.grpo(scores, mask, index),
        "dr_grpo": lambda: A.dr_grpo(scores, mask, index),
        "rloo": lambda: A.rloo(scores, mask, index),
        "gpg": lambda: A.gpg(scores, mask, index),
        "grpo_passk": lambda: A.grpo_passk(scores, mask, index),
        "opo": lambda: A.opo(scores, mask, index),
        "reinforce_pp_baseline": lambda: A.reinforce_pp_baseline(scores, mask, index),
    }
    for name, fn in cases.items():  # the fused output must be what the estimator wrote
        adv = fn()[0]  # type: ignore[index]
        assert adv.shape == (n, t) and adv.dtype == torch.float32, name
    ratios: dict[str, list[float]] = {k: [] for k in cases}
    ours_t: dict[str, list[float]] = {k: [] for k in cases}
    base_t: list[float] = []
    names = list(cases)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            # the estimator and both floors timed back to back, in a rotating order, so that
            # each ratio compares passes that ran under the same machine load
            trio: list[tuple[str, Callable[[], object]]] = [*floors.items(), (name, cases[name])]
            trio = trio[r % 3 :] + trio[: r % 3]
            timed = {k: best_time(fn, repeat=3) for k, fn in trio}
            base = min(timed[k] for k in floors)
            ratios[name].append(timed[name] / base)
            ours_t[name].append(timed[name])
            base_t.append(base)
    rows = []
    for name in cases:
        q = statistics.quantiles(ratios[name], n=4)  # [p25, median, p75]
        rows.append(
            {
                "case": f"{name} N={n} T={t}" + (" shuffled index" if shuffled else ""),
                "baseline": "fused pass: min(scores[:,None]*mask, where(mask, scores[:,None], 0))",
                "ours_ms": statistics.median(ours_t[name]) * 1e3,
                "baseline_ms": statistics.median(base_t) * 1e3,
                "ratio_median": q[1],
                "ratio_p25": q[0],
                "ratio_p75": q[2],
                "ratio_max": max(ratios[name]),
                "rounds": rounds,
                "target": "<=1.2x",
                "note": "also reads the mask for lengths"
                if name in ("opo", "reinforce_pp_baseline")
                else "",
            }
        )
    return rows


# --------------------------------------------------------------------------- 3. chunked log-probs

CHILD = r"""
import os, sys, json, resource, time
os.environ["OMP_NUM_THREADS"] = "1"
import torch
torch.set_num_threads(1)
from rl_algos.logprobs import log_probs_from_logits, entropy_from_logits, log_probs_from_logits_chunked
n, v, variant, chunk = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
g = torch.Generator().manual_seed(0)
logits = torch.empty(n, v, dtype=torch.bfloat16)
for s in range(0, n, 64):  # fill without a float32 transient
    logits[s:s + 64] = torch.randn(min(64, n - s), v, generator=g)
labels = torch.randint(0, v, (n,), generator=g)
def rss_peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
before = rss_peak()
if variant == "naive":
    lp = log_probs_from_logits(logits, labels); ent = entropy_from_logits(logits)
else:
    lp, ent = log_probs_from_logits_chunked(logits, labels, chunk_size=chunk, with_entropy=True)
after = rss_peak()
print(json.dumps({"extra_bytes": after - before, "lp_sum": float(lp.double().sum()), "ent_sum": float(ent.double().sum())}))
"""


def child_peak(n: int, v: int, variant: str, chunk: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), str(v), variant, str(chunk)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_logprobs(n: int, v: int, chunk: int) -> list[dict]:
    naive_mem = child_peak(n, v, "naive", chunk)
    chunk_mem = child_peak(n, v, "chunked", chunk)
    g = torch.Generator().manual_seed(0)
    logits = torch.empty(n, v, dtype=torch.bfloat16)
    for s in range(0, n, 64):
        logits[s : s + 64] = torch.randn(min(64, n - s), v, generator=g)
    labels = torch.randint(0, v, (n,), generator=g)

    def naive():
        return log_probs_from_logits(logits, labels), entropy_from_logits(logits)

    def chunked():
        return log_probs_from_logits_chunked(logits, labels, chunk_size=chunk, with_entropy=True)

    lp_n, ent_n = naive()
    lp_c, ent_c = chunked()
    assert ent_c is not None
    err = max((lp_n - lp_c).abs().max().item(), (ent_n - ent_c).abs().max().item())
    t_n, t_c = [], []
    for _ in range(3):
        t_n.append(best_time(naive, repeat=1, warmup=0))
        t_c.append(best_time(chunked, repeat=1, warmup=0))
    return [
        {
            "case": f"log-prob+entropy N={n} V={v} bf16, chunk={chunk}",
            "naive_ms": min(t_n) * 1e3,
            "chunked_ms": min(t_c) * 1e3,
            "time_ratio": min(t_c) / min(t_n),
            "naive_extra_MiB": naive_mem["extra_bytes"] / 2**20,
            "chunked_extra_MiB": chunk_mem["extra_bytes"] / 2**20,
            "mem_ratio": chunk_mem["extra_bytes"] / max(naive_mem["extra_bytes"], 1),
            "max_abs_err": err,
            "target": "mem<=10%, time<=1.3x",
        }
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller shapes (smoke run)")
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--only", choices=["gae", "groups", "logprobs"], default=None)
    args = ap.parse_args()
    allocator_pinned = keep_freed_memory()
    rows: list[dict] = []
    if args.only in (None, "gae"):
        rows += bench_gae(16, 512) if args.quick else bench_gae(64, 4096)
    if args.only in (None, "groups"):
        for shuffled in (False, True):
            rows += (
                bench_groups(1024, 128, shuffled=shuffled)
                if args.quick
                else bench_groups(8192, 512, shuffled=shuffled)
            )
    if args.only in (None, "logprobs"):
        rows += (
            bench_logprobs(256, 32000, args.chunk)
            if args.quick
            else bench_logprobs(4096, 151936, args.chunk)
        )
    print(
        f"torch {torch.__version__}, threads={torch.get_num_threads()}, "
        f"glibc keeps freed memory: {allocator_pinned}"
    )
    for r in rows:
        print(
            json.dumps(
                {k: (float(f"{x:.4g}") if isinstance(x, float) else x) for k, x in r.items()}
            )
        )


if __name__ == "__main__":
    main()
