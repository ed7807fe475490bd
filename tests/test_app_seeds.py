"""tools/app_seeds.py: the table over seeds (mean ± standard error of each metric and gain) from
runs' summary.json, and each seed's outputs kept apart."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tools import app_seeds


def _summary(greedy: tuple[float, float], wall: float) -> dict:
    before = {"val/greedy/accuracy": greedy[0], "val/accuracy": 0.3, "val/pass@k": 0.8,
              "val/num_prompts": 400.0, "val/baseline_accuracy": 0.01}  # fmt: skip
    after = {**before, "val/greedy/accuracy": greedy[1], "val/accuracy": 0.5}
    gain = {"gain": greedy[1] - greedy[0], "se": 0.03, "gain_in_se": (greedy[1] - greedy[0]) / 0.03}
    return {"eval_before": before, "eval_after": after, "wall_seconds": wall,
            "summary": {"gain val/greedy/accuracy": gain,
                        "dynamic_sampling kept fraction": 0.5}}  # fmt: skip


def test_the_table_gives_mean_and_standard_error_over_seeds():
    table = app_seeds.table("rlvr", {1: _summary((0.4, 0.6), 100), 2: _summary((0.4, 0.7), 110)})
    rows = {ln.split(" | ")[0].strip("| "): ln.split(" | ")[1:] for ln in table.splitlines()
            if ln.startswith("| ")}  # fmt: skip
    # gains 0.2 and 0.3: mean 0.25, standard error stdev / sqrt(2) = 0.0707 / 1.414 = 0.05
    assert rows["gain (after - before)"][0] == "0.250 ± 0.050"
    assert rows["gain (after - before)"][1].startswith("0.200 ± 0.000")  # sampled 0.3 -> 0.5
    assert rows["before RL (after the warm-up)"][0] == "0.400 ± 0.000"
    assert rows["trivial baseline (most frequent training answer)"][0] == "0.010 ± 0.000"
    per_run = [float(x) for x in rows["gain in its standard errors (per run)"][0].split(" ± ")]
    assert per_run[0] == pytest.approx(25 / 3, abs=1e-3)
    assert "400 held-out items; seeds 1, 2" in table.splitlines()[0]
    assert "groups kept by dynamic sampling: 0.500 ± 0.000" in table
    assert "wall per run (pipeline, without the install): 100s, 110s" in table
    assert "machine: " in table and " cores" in table
    assert math.isclose(float(rows["after RL"][0].split(" ± ")[0]), 0.65)


def test_a_seed_writes_only_under_its_own_directory(tmp_path, monkeypatch):
    """Every output a run writes is named into the seed's directory (the tiny model and the data
    into the shared one), and a finished seed is reused without running."""
    calls = []

    def fake_run(cmd, cwd, stdout, stderr):
        calls.append(cmd)
        out = Path(next(a.split("=", 1)[1] for a in cmd if a.startswith("output_dir=")))
        (out / "summary.json").write_text(json.dumps(_summary((0.4, 0.5), 1)))
        return type("P", (), {"returncode": 0})()

    monkeypatch.setattr(app_seeds.subprocess, "run", fake_run)
    for app in ("rlvr", "agentic"):
        app_seeds.run_seed(app, 3, tmp_path / app, None, ["max_steps=2"], rerun=False)
        app_seeds.run_seed(app, 3, tmp_path / app, None, [], rerun=False)  # reused
    assert len(calls) == 2
    for cmd in calls:
        assert "seed=3" in cmd and cmd[-1] == "max_steps=2"
        paths = [a.split("=", 1)[1] for a in cmd[2:] if "=" in a and "/" in a.split("=", 1)[1]]
        assert paths and all(p.startswith(str(tmp_path)) for p in paths)


def test_unknown_apps_and_seed_counts_are_refused(capsys):
    with pytest.raises(SystemExit):
        app_seeds.main(["nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        app_seeds.main(["rlvr", "--seeds", "0"])
    assert "--seeds 0: at least 1" in capsys.readouterr().err


def test_overrides_may_follow_the_seed_list(tmp_path, monkeypatch):
    """`APP --seed-list 1 2 --out DIR key=value` (the docstring's form): the overrides reach
    every run and the seeds are the listed ones."""
    runs = []

    def fake_run_seed(app, seed, out, config, overrides, rerun):
        runs.append((app, seed, out, overrides))
        return _summary((0.4, 0.5), 1)

    monkeypatch.setattr(app_seeds, "run_seed", fake_run_seed)
    app_seeds.main(["agentic", "--seed-list", "1", "2", "--out", str(tmp_path), "max_steps=2"])
    assert runs == [("agentic", s, tmp_path, ["max_steps=2"]) for s in (1, 2)]


def _async_summary(speedup: float, greedy_after: float, in_se: float) -> dict:
    run = {
        "samples_per_s": 200.0,
        "heldout_greedy_accuracy": greedy_after,
        "heldout_accuracy": 0.2,
        "heldout_pass_at_k": 0.4,
        "wall_seconds": 100.0,
        "gains": {"greedy": {"gain": greedy_after - 0.15, "se": 0.03, "gain_in_se": in_se}},
    }
    faster = {**run, "samples_per_s": 200.0 * speedup, "lag_mean": 0.95, "wall_seconds": 90.0}
    return {"sync": run, "async": faster, "speedup": speedup,
            "heldout_before_rl": {"greedy": 0.15, "sampled": 0.1, "pass@k": 0.3}}  # fmt: skip


def test_the_async_table_gives_each_run_and_the_speedup_over_seeds():
    """apps/async's summary.json holds two runs: the table has a column per run, and the
    speedup, the shared pre-RL evaluation and the lag under it."""
    table = app_seeds.table("async", {1: _async_summary(1.6, 0.25, 3.0),
                                      2: _async_summary(1.8, 0.35, 5.0)})  # fmt: skip
    rows = {ln.split(" | ")[0].strip("| "): ln.split(" | ")[1:] for ln in table.splitlines()
            if ln.startswith("| ")}  # fmt: skip
    assert table.splitlines()[0] == "| apps/async (seeds 1, 2) | synchronous | asynchronous |"
    # greedy gains 0.10 and 0.20: mean 0.15, standard error 0.0707 / sqrt(2) = 0.05
    assert rows["greedy gain (after - before)"][0] == "0.150 ± 0.050"
    assert rows["greedy gain in its standard errors (per run)"][1].startswith("4.000 ± 1.000")
    assert rows["samples/s"][1].startswith("340.000 ± 20.000")  # 320 and 360
    assert rows["sampled gain (after - before)"][0].startswith("-")  # no sampled gain given
    # speedups 1.6 and 1.8: mean 1.7, standard error 0.1
    assert "speedup (asynchronous / synchronous samples/s): 1.700 ± 0.100" in table
    assert "(per seed: 1.600, 1.800)" in table
    assert "held-out greedy before RL (both runs): 0.150 ± 0.000" in table
    assert "asynchronous policy lag (mean, weight versions): 0.950 ± 0.000" in table
    assert "wall per seed (both runs, without the install): 190s, 190s" in table
    assert "machine: " in table
