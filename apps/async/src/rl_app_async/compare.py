"""The two runs apps/async compares and the figures it reports (pure: overrides and summaries).

Both runs are apps/rlvr's recipe on the same config and devices; only `async.max_staleness`
differs (0: synchronous; the async run's value: the command line's, else the config's, else 1:
one-step-off). samples/s is trained
samples per second of the training loop (`RunResult.throughput`: evaluation and checkpoints not
counted); held-out accuracy is the final evaluation's (`val/accuracy`: sampled like training,
`val/greedy/accuracy`: greedy decoding).
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import Any

ASYNC_LAYOUT: dict[str, Any] = {
    # rollout (actor_infer) on its own CPU bundle, training on the other: rollout can generate
    # while the trainer trains; the synchronous run uses the same layout (a like-for-like ratio)
    "num_gpus_per_node": 2,
    "actor_train.device_mapping": "[0]",
    "actor_infer.device_mapping": "[1]",
    "reference.device_mapping": "[0]",
    # importance weights against the engine's behaviour log-probs (both runs, like for like)
    "train_infer_correction.is_weight.enabled": "true",
    "train_infer_correction.is_weight.upper_bound": 2.0,
}
"""The placement (and IS correction) both runs share: also tools/bench/async.py's."""

CPU_DEFAULTS: dict[str, Any] = {
    **ASYNC_LAYOUT,
    # apps/rlvr's task, warm-up and 30 steps, with the step balanced so that overlapping pays:
    # rollout and training each take ~0.4 s of a synchronous step (one generation round of dynamic
    # sampling instead of up to three; two passes over each batch instead of one); synchronously
    # apps/rlvr's own step is rollout-bound (rollout 0.5 s, training 0.2 s: at most 1.4x)
    "dynamic_sampling.max_num_gen_batches": 1,
    "ppo_epochs": 2,
    # the asynchronous run's weight updates reach the generations in flight (Ray only)
    "async.partial_rollout": "true",
    "output_dir": "./output/async_cpu",
}
"""Overrides of apps/rlvr's CPU default when apps/async runs without --config."""

STALENESS_KEY = "async.max_staleness"
RATIO_KEY = "async_generation_ratio"
#: keys that apply to the asynchronous run only (the synchronous run refuses them)
ASYNC_ONLY_KEYS = ("async.partial_rollout",)


def override_key(key: str) -> str:
    """The dotted key of an override's left side (`+key` adds a key, the same key here)."""
    return key.strip().lstrip("+")


def split_staleness(overrides: list[str]) -> tuple[list[str], int | None]:
    """The overrides without `async.max_staleness=...`, and that value (None when absent: see
    `async_staleness`)."""
    rest, staleness = [], None
    for item in overrides:
        key, _, value = item.partition("=")
        if override_key(key) == STALENESS_KEY:
            try:
                staleness = int(value)
            except ValueError:
                raise ValueError(
                    f"{STALENESS_KEY}={value!r}: expected a whole number of weight versions"
                ) from None
        else:
            rest.append(item)
    if staleness is not None and staleness < 1:
        raise ValueError(f"{STALENESS_KEY}={staleness}: the asynchronous run needs at least 1")
    return rest, staleness


def async_staleness(given: int | None, configured: int | None) -> int:
    """The asynchronous run's bound (the synchronous run uses 0): the command line's
    `async.max_staleness`, else the config's (the file's, or derived from
    async_generation_ratio) when at least 1, else 1 (one-step-off)."""
    if given is not None:
        return given
    return configured if configured is not None and configured >= 1 else 1


def split_async_only(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(the overrides both runs get, those only the asynchronous run gets: `ASYNC_ONLY_KEYS`,
    e.g. `async.partial_rollout=true`, which rl_config refuses with `max_staleness: 0`)."""
    both, only = [], []
    for item in overrides:
        key = override_key(item.partition("=")[0])
        (only if key in ASYNC_ONLY_KEYS else both).append(item)
    return both, only


def run_overrides(base: list[str], output_dir: str, mode: str, staleness: int) -> list[str]:
    """One run's overrides: its own output directories under `output_dir/<mode>`. The log
    directory is set as `tracker_kwargs.log_dir` too, which would otherwise override
    `logging_dir` for both runs (one metrics.jsonl for both; the lag figures read each run's).
    The synchronous run (`staleness` 0) also sets ROLL's `async_generation_ratio` to 0: a
    config's ratio is the asynchronous run's bound (max_staleness = ceil(ratio)), and kept in
    the synchronous run it contradicts max_staleness 0 (a config error)."""
    out = f"{output_dir.rstrip('/')}/{mode}"
    return [*base, f"output_dir={out}", f"logging_dir={out}/logs",
            f"tracker_kwargs.log_dir={out}/logs",
            f"checkpoint_config.output_dir={out}/checkpoints",
            *([] if staleness else [f"{RATIO_KEY}=0"]),
            f"{STALENESS_KEY}={staleness}"]  # fmt: skip


def step_rows(log_dir: str) -> list[dict[str, Any]]:
    """The run's training-step rows of its metrics.jsonl (none without the file)."""
    from rl_runtime.track.tracking import read_metrics

    rows = read_metrics(log_dir) if (Path(log_dir) / "metrics.jsonl").exists() else []
    return [r for r in rows if r.get("step", 0) > 0 and "train/loss" in r]


#: held-out metrics the summary reports (name -> key of an evaluation's metrics)
HELD_OUT = {"greedy": "val/greedy/accuracy", "sampled": "val/accuracy", "pass@k": "val/pass@k"}


def held_out(metrics: dict[str, Any]) -> dict[str, float]:
    """The `HELD_OUT` figures of one evaluation (those it has)."""
    return {name: metrics[key] for name, key in HELD_OUT.items() if key in metrics}


def run_summary(
    result: Any, rows: list[dict[str, Any]], before: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A run's figures: throughput, final held-out accuracy, RL's gain over `before` (the
    pre-RL evaluation both runs share: rl_runtime.pipelines.rlvr.metrics.held_out_gains, with
    standard errors), and (async) policy lag."""
    from rl_runtime.pipelines.rlvr.metrics import held_out_gains

    after = result.eval_after
    out: dict[str, Any] = {
        "samples_per_s": round(result.throughput.get("samples_per_s", 0.0), 3),
        "heldout_accuracy": after.get("val/accuracy"),
        "heldout_greedy_accuracy": after.get("val/greedy/accuracy"),
        "heldout_pass_at_k": after.get("val/pass@k"),
        "steps": result.step,
        "samples_trained": result.throughput.get("samples_trained", 0.0),
        "loop_seconds": round(result.throughput.get("loop_seconds", 0.0), 1),
        "wall_seconds": round(result.wall_seconds, 1),
    }
    gains = held_out_gains(before or {}, after)
    out["gains"] = {name: gains[f"gain {key}"] for name, key in HELD_OUT.items()
                    if f"gain {key}" in gains}  # fmt: skip
    lagged = [r for r in rows if "async/lag_mean" in r]
    if lagged:
        trained = sum(r["rollout/num_trajectories"] for r in lagged)
        out["lag_mean"] = round(
            sum(r["async/lag_mean"] * r["rollout/num_trajectories"] for r in lagged) / trained, 3
        )
        out["lag_max"] = max(r["async/lag_max"] for r in lagged)
        out["dropped_stale_samples"] = lagged[-1]["async/dropped_stale_total"]
        out["trainer_idle_s_mean"] = round(mean(r["async/trainer_idle_s"] for r in lagged), 2)
    return out


def table_rows(summary: dict[str, Any]) -> dict[str, dict[str, float | str]]:
    """Rows of the side-by-side table: a row per figure, a column per run (sync, async); a gain
    reads `+0.108 (3.9 SE)`."""
    keys = ("samples_per_s", "loop_seconds", "heldout_greedy_accuracy", "heldout_accuracy",
            "heldout_pass_at_k", "lag_mean", "lag_max", "dropped_stale_samples")  # fmt: skip
    rows: dict[str, dict[str, float | str]] = {}
    for mode in ("sync", "async"):
        run = summary[mode]
        label = mode if mode == "sync" else f"async (max_staleness {summary['max_staleness']})"
        for k in keys:
            if run.get(k) is not None:
                rows.setdefault(k, {})[label] = run[k]
        for name, gain in run.get("gains", {}).items():
            in_se = gain.get("gain_in_se")
            rows.setdefault(f"{name} gain", {})[label] = f"{gain['gain']:+.3f}" + (
                f" ({in_se:.1f} SE)" if in_se is not None else ""
            )
    return rows
