"""tools/bench/async.py's ratios from per-step metrics, against hand-computed values."""

from __future__ import annotations

import importlib

import pytest

bench_async = importlib.import_module(
    "tools.bench.async"
)  # `async` is a keyword: no import statement


def _rows(step_seconds: list[float], samples: float = 128.0) -> list[dict[str, float]]:
    return [{"timing/step": s, "rollout/num_trajectories": samples} for s in step_seconds]


def test_second_half_rate_counts_only_the_later_steps():
    # 5 steps: the second half is the last 3 (1 + 1 + 2 s for 3 x 128 samples)
    rows = _rows([10.0, 10.0, 1.0, 1.0, 2.0])
    assert bench_async.second_half_rate(rows) == pytest.approx(3 * 128 / 4.0)
    assert bench_async.second_half_rate([]) == 0.0


def test_compare_reports_the_second_half_beside_the_whole_run():
    sync = {"samples_per_s": 100.0, "t_roll_s": 0.2, "t_train_s": 0.3,
            "samples_per_s_second_half": 200.0}  # fmt: skip
    run = {"samples_per_s": 130.0, "t_roll_s": 0.25, "t_train_s": 0.35,
           "samples_per_s_second_half": 320.0}  # fmt: skip
    out = bench_async.compare({"sync": sync, "staleness_1": run})
    assert out["measured_speedup"] == {"staleness_1": 1.3}
    assert out["measured_speedup_second_half"] == {"staleness_1": 1.6}
    assert out["ideal_speedup_from_sync_timings"] == pytest.approx(0.5 / 0.3, abs=1e-3)
    assert out["predicted_speedup_from_own_timings"] == {"staleness_1": round(0.5 / 0.35, 3)}


def test_repeat_summary_reports_mean_standard_error_and_range():
    rounds = [
        {
            "measured_speedup": {"staleness_1": 1.2},
            "measured_speedup_second_half": {"staleness_1": 1.5},
        },
        {
            "measured_speedup": {"staleness_1": 1.4},
            "measured_speedup_second_half": {"staleness_1": 1.9},
        },
        {
            "measured_speedup": {"staleness_1": 1.6},
            "measured_speedup_second_half": {"staleness_1": 1.7},
        },
    ]
    out = bench_async.repeat_summary(rounds)
    whole = out["measured_speedup"]["staleness_1"]
    # mean 1.4; sample standard deviation 0.2; standard error 0.2 / sqrt(3) = 0.1155
    assert whole == {"mean": 1.4, "standard_error": 0.115, "min": 1.2, "max": 1.6, "rounds": 3}
    half = out["measured_speedup_second_half"]["staleness_1"]
    assert half["mean"] == 1.7 and half["standard_error"] == 0.115  # deviations -0.2, 0.2, 0
    assert (half["min"], half["max"]) == (1.5, 1.9)
    one = bench_async.repeat_summary(rounds[:1])["measured_speedup"]["staleness_1"]
    assert one["standard_error"] is None and one["mean"] == 1.2


def test_repeat_summary_sets_held_out_accuracy_against_sync_round_by_round():
    """With --vary-seed, `sync` itself varies between rounds: each asynchronous run's accuracy
    is compared with the same round's `sync` (paired), beside every run's own spread."""

    def runs(sync: float, async_: float) -> dict[str, dict[str, float]]:
        return {name: {"heldout_accuracy": acc, "heldout_greedy_accuracy": acc + 0.1}
                for name, acc in (("sync", sync), ("staleness_2", async_))}  # fmt: skip

    rounds = [{"runs": runs(0.6, 0.55)}, {"runs": runs(0.5, 0.52)}, {"runs": runs(0.7, 0.66)}]
    out = bench_async.repeat_summary(rounds)
    assert out["heldout_accuracy"]["sync"]["mean"] == 0.6  # 0.5 .. 0.7: the seeds' spread
    assert out["heldout_accuracy"]["sync"]["standard_error"] == 0.058  # 0.1 / sqrt(3)
    diff = out["heldout_accuracy_minus_sync"]["staleness_2"]
    # differences -0.05, +0.02, -0.04: mean -0.0233, sd 0.0379, se 0.0219
    assert diff == {"mean": -0.023, "standard_error": 0.022, "min": -0.05, "max": 0.02,
                    "rounds": 3}  # fmt: skip
    assert out["heldout_greedy_accuracy_minus_sync"]["staleness_2"]["mean"] == -0.023
    assert "sync" not in out["heldout_accuracy_minus_sync"]


def test_compare_sets_the_asynchronous_runs_against_the_colocated_synchronous_run_too():
    def run(rate: float) -> dict[str, float]:
        return {"samples_per_s": rate, "t_roll_s": 0.2, "t_train_s": 0.3,
                "samples_per_s_second_half": rate}  # fmt: skip

    out = bench_async.compare(
        {"sync": run(100.0), "sync_colocated": run(125.0), "staleness_2_partial": run(150.0)}
    )
    # the colocated synchronous run is a baseline, not an asynchronous run
    assert out["measured_speedup"] == {"staleness_2_partial": 1.5}
    assert out["sync_colocated_speedup"] == 1.25
    assert out["measured_speedup_vs_sync_colocated"] == {"staleness_2_partial": 1.2}
    assert "sync_colocated_speedup" not in bench_async.compare({"sync": run(100.0)})
