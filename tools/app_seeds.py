"""Run an app's CPU default (or `--config FILE`) over several seeds and print a markdown table of
its held-out metrics: mean and standard error over the seeds of the trivial baselines, of before
RL (after the warm-up) and after RL, and of RL's gain, with a line naming the machine and date.

    python tools/app_seeds.py rlvr --seeds 3             # seeds 1 2 3, ./output/app_seeds/rlvr
    python tools/app_seeds.py agentic --seed-list 1 2 --out DIR key=value ...
    python tools/app_seeds.py async --seeds 3            # both runs per seed, and the speedup

Runs one seed at a time (each a whole run of the app, as `uv run apps/rlvr` runs, in Python);
reuses a seed's finished summary.json unless --rerun. Each run's own output (per-step lines)
goes to DIR/seed_S/run.log. A gain's standard error over seeds says how far another run of the
same command lands (on this machine; a run is deterministic per machine and seed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class AppSeeds:
    """What the tool reads of one app: `columns` (column name -> held-out metric key of
    eval_before / eval_after), `baselines` (row name -> metric key of eval_after: a trivial
    baseline, the same in every column it fills), `run_overrides(run_dir, shared_dir)`: the
    overrides that keep a seed's outputs in its own directory (what every seed may share, the
    tiny model and generated data, goes to `shared_dir`), `extras`: summary.json figures printed
    under the table (name -> key of its `summary`); `lines`: the table's body for an app whose
    summary.json has another shape (apps/async: two runs), given every seed's summary."""

    columns: dict[str, str]
    run_overrides: Callable[[Path, Path], list[str]]
    baselines: dict[str, str]
    extras: dict[str, str]
    lines: Callable[[dict[int, dict]], list[str]] | None = None


def _outputs(run_dir: Path) -> list[str]:
    return [f"output_dir={run_dir}", f"logging_dir={run_dir / 'logs'}",
            f"checkpoint_config.output_dir={run_dir / 'checkpoints'}"]  # fmt: skip


def _agentic(run_dir: Path, shared: Path) -> list[str]:
    return [*_outputs(run_dir), f"render_save_dir={run_dir / 'render'}",
            f"pretrain={shared / 'tiny_model'}",
            f"agentic_app.build_tiny_model={shared / 'tiny_model'}"]  # fmt: skip


def _rlvr(run_dir: Path, shared: Path) -> list[str]:
    data = shared / "rlvr_data"
    return [*_outputs(run_dir), f"pretrain={shared / 'tiny_model'}",
            f"rlvr_app.build_tiny_model={shared / 'tiny_model'}",
            f"rlvr_app.arith_data.out_dir={data}",
            f"actor_train.data_args.file_name={data / 'train.parquet'}",
            f"actor_train.data_args.eval_file_name={data / 'test.parquet'}"]  # fmt: skip


def _async_lines(summaries: dict[int, dict]) -> list[str]:
    """apps/async's table: each run's throughput, held-out accuracy after RL and gain over the
    pre-RL policy (evaluated once, shared by the two runs), then the speedup over seeds."""
    runs = {"sync": "synchronous", "async": "asynchronous"}
    after = {"greedy": "heldout_greedy_accuracy", "sampled": "heldout_accuracy",
             "pass@k": "heldout_pass_at_k"}  # fmt: skip
    rows: dict[str, Callable[[dict], float | None]] = {"samples/s": lambda r: r["samples_per_s"]}
    for name, key in after.items():
        rows[f"held-out {name} after RL"] = lambda r, key=key: r.get(key)
        rows[f"{name} gain (after - before)"] = (
            lambda r, name=name: r.get("gains", {}).get(name, {}).get("gain"))  # fmt: skip
        rows[f"{name} gain in its standard errors (per run)"] = (
            lambda r, name=name: r.get("gains", {}).get(name, {}).get("gain_in_se"))  # fmt: skip

    seeds = ", ".join(str(k) for k in summaries)
    lines = [f"| apps/async (seeds {seeds}) | " + " | ".join(runs.values()) + " |",
             "|---" * (len(runs) + 1) + "|"]  # fmt: skip
    for label, get in rows.items():
        cells = []
        for mode in runs:
            values = [get(s[mode]) for s in summaries.values()]
            cells.append(mean_se([float(v) for v in values if v is not None]))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    speedups = [s["speedup"] for s in summaries.values() if s.get("speedup") is not None]
    lines.append(f"speedup (asynchronous / synchronous samples/s): {mean_se(speedups)}"
                 f" (per seed: {', '.join(f'{v:.3f}' for v in speedups)})")  # fmt: skip
    for name in ("greedy", "sampled", "pass@k"):
        before = [s["heldout_before_rl"][name] for s in summaries.values()
                  if name in s.get("heldout_before_rl", {})]  # fmt: skip
        if before:
            lines.append(f"held-out {name} before RL (both runs): {mean_se(before)}")
    lags = [s["async"]["lag_mean"] for s in summaries.values() if "lag_mean" in s["async"]]
    if lags:
        lines.append(f"asynchronous policy lag (mean, weight versions): {mean_se(lags)}")
    walls = [sum(s[m]["wall_seconds"] for m in runs) for s in summaries.values()]
    lines.append(f"mean ± standard error over {len(summaries)} seed(s); wall per seed (both "
                 f"runs, without the install): {', '.join(f'{w:.0f}s' for w in walls)}")  # fmt: skip
    return lines


APPS = {
    "agentic": AppSeeds(
        columns={"sampled (T=1)": "val/success_rate", "greedy": "val/greedy/success_rate"},
        run_overrides=_agentic,
        baselines={},
        extras={},
    ),
    "rlvr": AppSeeds(
        columns={
            "greedy": "val/greedy/accuracy",
            "sampled (pass@1)": "val/accuracy",
            "pass@k": "val/pass@k",
        },
        run_overrides=_rlvr,
        baselines={"trivial baseline (most frequent training answer)": "val/baseline_accuracy"},
        extras={"groups kept by dynamic sampling": "dynamic_sampling kept fraction"},
    ),
    # apps/async runs apps/rlvr twice (its data and tiny model, shared by the seeds); its
    # summary.json holds both runs (rl_app_async.compare.run_summary)
    "async": AppSeeds(columns={}, run_overrides=_rlvr, baselines={}, extras={}, lines=_async_lines),
}


def run_seed(app: str, seed: int, out: Path, config: str | None, overrides: list[str],
             rerun: bool) -> dict:  # fmt: skip
    """One whole run of `app` with `seed=seed` under `out/seed_<seed>`; its summary.json."""
    run_dir = out / f"seed_{seed}"
    summary = run_dir / "summary.json"
    if summary.exists() and not rerun:
        return json.loads(summary.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "apps" / app), *(["--config", config] if config else [])]
    cmd += [f"seed={seed}", *APPS[app].run_overrides(run_dir, out), *overrides]
    t0 = time.perf_counter()
    with (run_dir / "run.log").open("w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"seed {seed} failed (exit {proc.returncode}); see {run_dir / 'run.log'}")
    print(f"seed {seed}: done in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    return json.loads(summary.read_text())


def mean_se(values: list[float]) -> str:
    """`mean ± standard error of the mean` over seeds (`mean` alone for one seed)."""
    if not values:
        return "-"
    m = statistics.fmean(values)
    if len(values) < 2:
        return f"{m:.3f}"
    return f"{m:.3f} ± {statistics.stdev(values) / math.sqrt(len(values)):.3f}"


def machine() -> str:
    """The machine the runs ran on, in words: CPU model, cores, memory, OS."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       cpu)  # fmt: skip
    except OSError:
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        memory = f", {mem:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        memory = ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu}, {cores} cores{memory}, {platform.system()} {platform.release()}"


def table(app: str, summaries: dict[int, dict]) -> str:
    """The markdown table over seeds (rows: baselines, before, after, gain, gain in SE)."""
    spec = APPS[app]
    if spec.lines is not None:
        lines = spec.lines(summaries)
        lines.append(f"machine: {machine()}; {datetime.date.today().isoformat()}")
        return "\n".join(lines)
    rows: dict[str, dict[str, list[float]]] = {}

    def add(row: str, column: str, value: float | None) -> None:
        if value is not None:
            rows.setdefault(row, {}).setdefault(column, []).append(float(value))

    for s in summaries.values():
        for name, key in spec.baselines.items():
            add(name, next(iter(spec.columns)), s["eval_after"].get(key))
        for name, metrics in s.get("baselines", {}).items():
            label = name.split(" (")[0]  # the agentic best sequence differs per seed
            for column, key in spec.columns.items():
                add(label, column, metrics.get(key))
        for name, part in (("before RL (after the warm-up)", "eval_before"),
                           ("after RL", "eval_after")):  # fmt: skip
            for column, key in spec.columns.items():
                add(name, column, s[part].get(key))
        for column, key in spec.columns.items():
            before, after = s["eval_before"].get(key), s["eval_after"].get(key)
            if before is not None and after is not None:
                add("gain (after - before)", column, after - before)
            gain = s.get("summary", {}).get(f"gain {key}")
            if gain and gain.get("gain_in_se") is not None:  # null: a gain with an SE of 0
                add("gain in its standard errors (per run)", column, gain["gain_in_se"])
    columns = list(spec.columns)
    n = sorted({int(v) for s in summaries.values() for k, v in s["eval_after"].items()
                if k.endswith(("num_prompts", "num_episodes"))})  # fmt: skip
    seeds = ", ".join(str(k) for k in summaries)
    held_out = f"{'/'.join(map(str, n))} held-out items; " if n else ""
    lines = [f"| apps/{app} ({held_out}seeds {seeds}) | " + " | ".join(columns) + " |",
             "|---" * (len(columns) + 1) + "|"]  # fmt: skip
    for name, cols in rows.items():
        lines.append(f"| {name} | " + " | ".join(mean_se(cols.get(c, [])) for c in columns) + " |")
    lines.append("")
    for name, key in spec.extras.items():
        values = [s["summary"][key] for s in summaries.values() if key in s.get("summary", {})]
        if values:
            lines.append(f"{name}: {mean_se(values)}")
    walls = [s["wall_seconds"] for s in summaries.values()]
    lines.append(f"mean ± standard error over {len(summaries)} seed(s); wall per run (pipeline, "
                 f"without the install): {', '.join(f'{w:.0f}s' for w in walls)}")  # fmt: skip
    lines.append(f"machine: {machine()}; {datetime.date.today().isoformat()}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("app", choices=sorted(APPS), help="the app under apps/")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--seeds", type=int, default=3, help="run seeds 1..N (default 3)")
    which.add_argument("--seed-list", type=int, nargs="+", help="run these seeds")
    ap.add_argument("--out", type=Path, help="default: ./output/app_seeds/APP")
    ap.add_argument("--config", default=None, help="experiment YAML (default: the CPU default)")
    ap.add_argument("--rerun", action="store_true", help="run seeds that already have a summary")
    ap.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    # intermixed: `rlvr --seed-list 1 2 key=value` (a plain parse takes key=value for a seed)
    args = ap.parse_intermixed_args(argv)
    if args.seeds < 1:
        ap.error(f"--seeds {args.seeds}: at least 1")
    seeds = args.seed_list or list(range(1, args.seeds + 1))
    out = (args.out or ROOT / "output" / "app_seeds" / args.app).resolve()
    summaries = {s: run_seed(args.app, s, out, args.config, args.overrides, args.rerun)
                 for s in seeds}  # fmt: skip
    print(table(args.app, summaries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
