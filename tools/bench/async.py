"""Benchmark: synchronous against asynchronous RLVR on the CPU (rollout and training on separate
CPU bundles), with a long-tailed response-length distribution.

    uv run python tools/bench/async.py [--steps 8] [--out output/bench_async] [key=value ...]

apps/rlvr's CPU default (apps/async's layout: actor_train on bundle 0, actor_infer on bundle 1),
changed so response lengths have a long tail: responses may run to 48 tokens and the supervised
warm-up is cut short, so most samples stop after a few tokens ("#### 7") and some ramble to the
cap. Three runs, same seed and steps: `async.max_staleness` 0 (synchronous), 1 (one-step-off)
and 2. Partial rollout (`async.partial_rollout`) is refused until the engines support it, so its
variants are not run. Written to `<out>/async_bench.json`: per run trained samples/s, held-out
accuracy after the same number of trained samples (sampled `val/accuracy`, greedy), mean
rollout and training seconds per step, response lengths, policy lag; the speedup ratios; and the
prediction below from the synchronous run's timings.

How the ratio should scale. Synchronously a step costs t_roll + t_train (t_train: old
log-probs, training and the weight sync). With rollout on its own devices and max_staleness >= 1,
rollout of batch k+1 overlaps training on batch k, so in steady state a step costs
max(t_roll, t_train) and

    ideal speedup = (t_roll + t_train) / max(t_roll, t_train)        (at most 2, when balanced)

With R rollout devices and T training devices, t_roll ~ 1/R and t_train ~ 1/T (while each
scales), so the split that balances the two reaches the bound; an unbalanced split is capped by
the slower side (e.g. t_roll = 3 t_train gives 4/3). max_staleness 2 has the same steady-state
bound; it helps when per-step times vary (a long-tailed batch), since rollout can bank a batch
while a short one trains. What the formula leaves out (the measured ratio falls below it by
these): without partial rollout the weight sync waits for the generation in flight to finish,
adding up to one rollout call to t_train; on 2 shared cores the two sides also contend for memory
bandwidth and for the driver's Python thread.

Measured (2026-11-23, one run each, 8 steps x 128 samples, on this project's shared 2-core
machine at load average 10-11: other agents' jobs ran on the same cores, so rollout and training
did not each get a core):

| point | sync t_roll / t_train (s) | ideal | async t_roll / t_train (s) | own-timings prediction | measured samples/s ratio | held-out sampled (sync -> async) |
|---|---|---|---|---|---|---|
| default (rollout-bound), max_staleness 1 | 2.84 / 1.21 | 1.43 | 3.43 / 1.73 | 1.18 | 1.13 | 0.560 -> 0.555 |
| default, max_staleness 2 | 2.84 / 1.21 | 1.43 | 3.86 / 2.09 | 1.05 | 1.00 | 0.560 -> 0.555 |
| balanced (ppo_epochs=3, warm-up 5 steps), max_staleness 1 | 2.40 / 2.64 | 1.91 | 3.79 / 4.02 | 1.25 | 1.14 | 0.545 -> 0.565 |

(`--steps 8`, then `--steps 8 --staleness 0 1 ppo_epochs=3 rlvr_app.warmup.steps=5`; held-out:
100 prompts x 2 samples, the same 1024 samples trained in every run, so accuracy per sample
consumed compares directly; differences of 0.01-0.02 are within one standard error, 0.035-0.05.)
What the points say: the formula with the synchronous run's timings (ideal) overestimates the
loaded machine, because running both sides at once slowed each by 20-60 % (compare the sync and
async timings); with each async run's own timings it predicts the measured ratio within 0.05-0.11
(the rest: the sync waiting behind the generation in flight, per-step overheads). max_staleness 2
bought nothing here: rollout is the slower side, so the queue never holds a second batch (lag
max stayed 1). The 1.6x target of the issue needs the two sides to get a core each (a quiet
machine) and a balanced split; not measured here. The long tail is thin: mean response 5.3-5.8
tokens, max 15-48, 0-0.1 % truncated at 48, since even a 5-step warm-up teaches the tiny model to
stop; partial rollout, which is what a long tail would need, is not merged.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from statistics import mean, median
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT / "apps" / "async", ROOT / "apps" / "rlvr"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

LONG_TAIL = {
    # responses: "<reasoning padding> #### 8" (warm-up demonstrations padded with a long-tailed
    # number of words, P(k >= K) = (1 + K) ** -0.7, up to the cap) so the policy samples a
    # long-tailed length up to response_length
    "response_length": 64,
    "rlvr_app.warmup.steps": 30,
    "rlvr_app.warmup.response_template": "'{reasoning}#### {answer}'",
    "rlvr_app.warmup.reasoning_max_words": 56,  # + "#### 8" and eos: 61 tokens, within the cap
    "rlvr_app.warmup.reasoning_tail": 0.7,
    "rollout_batch_size": 16,
    "num_return_sequences_in_group": 8,
    "actor_train.training_args.per_device_train_batch_size": 32,
    "actor_train.training_args.gradient_accumulation_steps": 2,
    "ppo_epochs": 1,  # the rollout / training balance knob (training time ~ ppo_epochs)
    "val_batch_size": 100,
    "val_n_sample": 2,
    "dynamic_sampling.enable": "false",  # every step trains on the same number of samples
    "track_with": "stdout",
}
QUICK = {"val_batch_size": 16, "val_n_sample": 1}

#: name -> (async.max_staleness, async.partial_rollout)
RUNS: dict[str, tuple[int, bool]] = {
    "sync": (0, False),
    "staleness_1": (1, False),
    "staleness_2": (2, False),
    "staleness_1_partial": (1, True),
    "staleness_2_partial": (2, True),
}


def timings(rows: list[dict[str, Any]], asynchronous: bool) -> dict[str, float]:
    """Mean rollout and training seconds per step (training = old log-probs, train, sync), the
    response-length distribution (means over steps of per-step statistics) and partial-rollout
    and lag counts."""
    roll = [r["timing/rollout"] for r in rows]
    train = [r["timing/step"] - (0.0 if asynchronous else r["timing/rollout"]) for r in rows]
    lengths = [r["response/length_mean"] for r in rows]
    out = {
        "t_roll_s": round(mean(roll), 2),
        "t_train_s": round(mean(train), 2),
        "t_sync_s": round(mean(r.get("timing/sync", 0.0) for r in rows), 2),
        # the engines' generate calls within t_roll (the rest: decoding, sandboxed scoring)
        "t_generate_s": round(mean(r.get("timing/rollout_generate", 0.0) for r in rows), 2),
        "response_length_mean": round(mean(lengths), 2),
        "response_length_median_of_steps": round(median(lengths), 2),
        "response_length_p50": round(mean(r.get("response/length_p50", 0.0) for r in rows), 1),
        "response_length_p90": round(mean(r.get("response/length_p90", 0.0) for r in rows), 1),
        "response_length_max": max(r["response/length_max"] for r in rows),
        "truncated_rate": round(mean(r.get("response/truncated_rate", 0.0) for r in rows), 3),
        "resumed_samples": sum(r.get("rollout/resumed_samples", 0.0) for r in rows),
    }
    if asynchronous:
        hist = sorted({k for r in rows for k in r if k.startswith("async/lag_hist/")})
        out["lag_hist"] = {k.rsplit("/", 1)[1]: sum(r.get(k, 0.0) for r in rows) for k in hist}
        out["rollout_idle_s_mean"] = round(mean(r["async/rollout_idle_s"] for r in rows), 2)
    return out


def ideal_speedup(t_roll: float, t_train: float) -> float:
    return (t_roll + t_train) / max(t_roll, t_train)


def compare(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Ratios against the synchronous run: measured samples/s, the formula with the synchronous
    run's timings, and the formula's denominator with each async run's own timings."""
    sync = runs.get("sync")
    if not sync or not sync["samples_per_s"]:
        return {}
    serial = sync["t_roll_s"] + sync["t_train_s"]
    others = {name: r for name, r in runs.items() if name != "sync"}
    return {
        "ideal_speedup_from_sync_timings": round(
            ideal_speedup(sync["t_roll_s"], sync["t_train_s"]), 3
        ),
        "measured_speedup": {
            name: round(r["samples_per_s"] / sync["samples_per_s"], 3) for name, r in others.items()
        },
        "predicted_speedup_from_own_timings": {
            name: round(serial / max(r["t_roll_s"], r["t_train_s"]), 3)
            for name, r in others.items()
        },
    }


def thread_counts() -> dict[str, Any]:
    """Torch threads of this (driver) process; the Ray workers pin theirs to one
    (rl_runtime.workers._init_process)."""
    import torch

    return {"driver_torch_threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "worker_torch_threads": 1, "cpu_count": os.cpu_count()}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = argparse.ArgumentParser(
        prog="tools/bench/async.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", default="output/bench_async")
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS))
    parser.add_argument(
        "--quick", action="store_true",
        help="an end-to-end check: 3 steps, 16 held-out prompts x 1 sample",
    )  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="key=value, applied to every run")
    args = parser.parse_args(argv)
    from async_compare import CPU_DEFAULTS, run_overrides, run_summary, step_rows
    from rlvr_app import DEFAULT_CONFIG, compose_rlvr, load, run

    steps = 3 if args.quick else args.steps
    base = {**CPU_DEFAULTS, **LONG_TAIL, **(QUICK if args.quick else {}), "max_steps": steps,
            "eval_steps": steps, "save_steps": steps, "output_dir": args.out}  # fmt: skip
    overrides = [f"{k}={v}" for k, v in base.items()] + list(args.overrides)
    report: dict[str, Any] = {"steps": steps, "config": base, "extra_overrides": args.overrides,
                              "threads": thread_counts(), "runs": {}}  # fmt: skip
    t0 = time.perf_counter()
    for name in args.runs:
        staleness, partial = RUNS[name]
        run_args = run_overrides(overrides, args.out, name, staleness)
        if partial:
            run_args.append("async.partial_rollout=true")
        cfg, app = load(DEFAULT_CONFIG, run_args)
        components, plan = compose_rlvr(cfg)
        print(f"=== {name} (max_staleness={staleness}, partial_rollout={partial})", flush=True)
        result = run(cfg, app, components, plan, eval_before=False)
        rows = step_rows(cfg.logging_dir)
        report["runs"][name] = {**run_summary(result, rows), **timings(rows, staleness > 0)}
    report.update(compare(report["runs"]))
    report["total_seconds"] = round(time.perf_counter() - t0, 1)
    report["load_average"] = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "async_bench.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "config"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
