"""Run `uv run apps/agentic` (the CPU default, or `--config FILE`) over several seeds and print a
markdown table of validation success: mean and standard error over the seeds of each baseline,
of after-warm-up (= before RL) and after RL, sampled and greedy, and of RL's gain.

    python tools/agentic_seeds.py                         # seeds 1 2 3, ./output/agentic_seeds
    python tools/agentic_seeds.py --seeds 1 2 --out DIR key=value ...

Runs one seed at a time (each is a whole run); reuses a seed's finished summary.json unless
--rerun. Each run's own output (per-step lines) goes to DIR/seed_S/run.log.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import app_seeds  # tools/ (the script's dir): one run and the mean ± SE, shared with every app
from app_seeds import mean_se

SAMPLED, GREEDY = "val/success_rate", "val/greedy/success_rate"


def run_seed(seed: int, out: Path, config: str | None, overrides: list[str], rerun: bool) -> dict:
    """One whole run with `seed=seed` under `out/seed_<seed>`; its summary.json."""
    return app_seeds.run_seed("agentic", seed, out, config, overrides, rerun)


def table(summaries: dict[int, dict]) -> str:
    """The markdown table over seeds (rows: baselines, before, after, gain)."""
    rows: dict[str, dict[str, list[float]]] = {}

    def add(name: str, metrics: dict, column: str, key: str) -> None:
        if key in metrics:
            rows.setdefault(name, {}).setdefault(column, []).append(float(metrics[key]))

    for s in summaries.values():
        for name, metrics in s.get("baselines", {}).items():
            label = name.split(" (")[0]  # the best sequence differs per seed
            add(label, metrics, "sampled", SAMPLED)
        for name, metrics in (("after warm-up = before RL", s["eval_before"]),
                              ("after RL", s["eval_after"])):  # fmt: skip
            add(name, metrics, "sampled", SAMPLED)
            add(name, metrics, "greedy", GREEDY)
        for column, key in (("sampled", SAMPLED), ("greedy", GREEDY)):
            gain = s.get("summary", {}).get(f"gain {key}")
            if gain:
                rows.setdefault("gain (after - before)", {}).setdefault(column, []).append(
                    gain["gain"]
                )
                if gain["gain_in_se"] is not None:  # null: a gain with a standard error of 0
                    rows.setdefault("gain in standard errors", {}).setdefault(column, []).append(
                        gain["gain_in_se"]
                    )
    n = {int(s["eval_after"].get("val/num_episodes", 0)) for s in summaries.values()}
    seeds = ", ".join(str(k) for k in summaries)
    lines = [
        f"| validation success ({'/'.join(map(str, sorted(n)))} episodes; seeds {seeds}) "
        "| sampled (T=1) | greedy |",
        "|---|---|---|",
    ]
    for name, cols in rows.items():
        lines.append(f"| {name} | {mean_se(cols.get('sampled', []))} "
                     f"| {mean_se(cols.get('greedy', []))} |")  # fmt: skip
    walls = [s["wall_seconds"] for s in summaries.values()]
    lines.append("")
    lines.append(f"mean ± standard error over {len(summaries)} seed(s); wall per run (pipeline, "
                 f"without the install): {', '.join(f'{w:.0f}s' for w in walls)}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--out", type=Path, default=app_seeds.ROOT / "output" / "agentic_seeds")
    ap.add_argument("--config", default=None, help="experiment YAML (default: the CPU default)")
    ap.add_argument("--rerun", action="store_true", help="run seeds that already have a summary")
    ap.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    summaries = {
        seed: run_seed(seed, out, args.config, args.overrides, args.rerun) for seed in args.seeds
    }
    print(table(summaries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
