"""What `record_steps=every:1` adds to the whole step of each app's CPU default (rollout or
reference pass, advantages, learn call, weight sync): the step time the user sees, not the learn
call alone (`tools/bench/record_step.py` measures that, the stricter denominator).

Per app, in one process: one run of the CPU default with its own supervised warm-up and a
single step, whose trained policy (`hf_model`) is then the `pretrain` of every measured run
(warm-up off), so every measured run starts from the policy the default's RL steps start from.
Then `--rounds` pairs of runs of `--steps` steps each, plain (`record_steps=none`) and recorded
(`record_steps=every:1`), alternating so that load from other processes hits both alike. A
run's step time is the mean of its steps' `timing/step` (metrics.jsonl), the first step apart
(the one-off costs of a fresh trainer, and the checkpoint a chain of records starts from). The recorder's background writer runs during the next step, so its
work is inside that step's time; the last record's writing (one of `--steps`) is not counted.
Evaluation is off. The apps run as `uv run apps/<app>` runs them, on Ray unless `--no-ray`.

    uv run python tools/bench/record_app_step.py [--apps agentic,rlvr,dpo] [--rounds 3]
        [--steps 8] [--no-ray]

Per app the last line printed is `<app> record_ratio=<float>` (recorded / plain mean step
time over all rounds), after each round's ratio (their spread is the noise of the measure).
Measured numbers: the rl-runtime README (record and replay).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import statistics
import tempfile
from pathlib import Path

#: the option that switches each app's supervised warm-up off (none: the app has none)
WARMUP_OFF = {"agentic": "agentic_app.warmup.steps=0", "rlvr": "rlvr_app.warmup.steps=0"}


def run_app(app: str, argv: list[str], cwd: Path) -> None:
    """`uv run apps/<app> ARGV` in this process, from `cwd`, its output kept unless it fails."""
    main = importlib.import_module(f"rl_app_{app}.spec").main
    out = io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(argv)
    if code:
        raise SystemExit(f"{app} {' '.join(argv)} exited {code}:\n{out.getvalue()[-4000:]}")


def rl_step_rows(output_dir: Path) -> list[dict]:
    """The logged rows of a run's RL steps, in order (warm-up rows, logged at steps <= 0,
    apart)."""
    rows = [json.loads(line) for line in (output_dir / "logs" / "metrics.jsonl").open()]
    return sorted((r for r in rows if r["step"] > 0), key=lambda r: r["step"])


def bench_app(app: str, *, rounds: int, steps: int, ray: bool, root: Path) -> float:
    mode = [] if ray else ["--no-ray"]
    common = [*mode, "eval_steps=0"]
    pretrain: list[str] = []
    if app in WARMUP_OFF:
        run_app(app, [*common, "max_steps=1", f"output_dir={root / 'warm'}"], root)
        pretrain = [f"pretrain={root / 'warm' / 'hf_model'}", WARMUP_OFF[app]]
    per_step: dict[str, list[float]] = {"none": [], "every:1": []}
    round_ratios: list[float] = []
    record_bytes: list[float] = []
    for r in range(rounds):
        means = {}
        for record in per_step:
            out = root / f"run-{r}-{record.replace(':', '')}"
            run_app(app, [*common, *pretrain, f"max_steps={steps}", f"output_dir={out}",
                          f"record_steps={record}"], root)  # fmt: skip
            rows = rl_step_rows(out)
            seconds = [row["timing/step"] for row in rows[1:]]
            per_step[record] += seconds
            means[record] = statistics.mean(seconds)
            record_bytes += [row["record/bytes"] for row in rows if "record/bytes" in row]
        round_ratios.append(means["every:1"] / means["none"])
    plain, recorded = statistics.mean(per_step["none"]), statistics.mean(per_step["every:1"])
    print(f"{app}: {len(per_step['none'])} steps per mode: plain {plain:.4f} s per step, "
          f"recorded {recorded:.4f} s; per round ratio "
          f"{' '.join(f'{x:.3f}' for x in round_ratios)}; record "
          f"{statistics.median(record_bytes):.0f} bytes per step")  # fmt: skip
    print(f"{app} record_ratio={recorded / plain:.3f}", flush=True)
    return recorded / plain


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--apps", default="agentic,rlvr,dpo")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--no-ray", dest="ray", action="store_false")
    args = parser.parse_args()
    for app in args.apps.split(","):
        root = Path(tempfile.mkdtemp(prefix=f"record-app-{app}-"))
        bench_app(app, rounds=args.rounds, steps=args.steps, ray=args.ray, root=root)


if __name__ == "__main__":
    main()
