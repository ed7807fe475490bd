"""apps/async: the two runs it compares (overrides, dry run) and the figures it reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rl_app_async.compare import (
    async_staleness,
    run_overrides,
    run_summary,
    split_async_only,
    split_staleness,
)
from tests.app_loading import run_in_process

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "async"


def test_the_async_runs_bound_comes_from_the_overrides_and_sync_is_zero():
    rest, staleness = split_staleness(["max_steps=3", "async.max_staleness=2"])
    assert rest == ["max_steps=3"] and staleness == 2
    assert split_staleness([])[1] is None  # not given: the config's, else 1 (async_staleness)
    assert async_staleness(None, None) == 1 and async_staleness(None, 0) == 1  # one-step-off
    assert async_staleness(None, 3) == 3 and async_staleness(2, 3) == 2  # the command line wins
    with pytest.raises(ValueError, match="async.max_staleness=0"):
        split_staleness(["async.max_staleness=0"])
    with pytest.raises(ValueError, match=r"async.max_staleness='1.5': expected a whole number"):
        split_staleness(["async.max_staleness=1.5"])
    assert split_staleness(["+async.max_staleness=2"]) == ([], 2)
    sync = run_overrides(rest, "out/x/", "sync", 0)
    assert sync[-6:] == ["output_dir=out/x/sync", "logging_dir=out/x/sync/logs",
                         "tracker_kwargs.log_dir=out/x/sync/logs",  # it overrides logging_dir
                         "checkpoint_config.output_dir=out/x/sync/checkpoints",
                         "async_generation_ratio=0",  # a config's ratio is the async run's
                         "async.max_staleness=0"]  # fmt: skip
    assert "async_generation_ratio=0" not in run_overrides(rest, "out/x/", "async", 2)


def test_partial_rollout_goes_to_the_async_run_only():
    both, only = split_async_only(["max_steps=3", "async.partial_rollout=true"])
    assert both == ["max_steps=3"] and only == ["async.partial_rollout=true"]
    added = "+async.partial_rollout=true"  # the `+key` form of the same key
    assert split_async_only([added]) == ([], [added])


def test_dry_run_with_partial_rollout_plans_it_for_the_async_run_only(tmp_path):
    """`uv run apps/async async.partial_rollout=true`: the synchronous run (max_staleness 0)
    would refuse the key, so only the asynchronous run gets it."""
    proc = run_in_process("async", ["--dry-run", "async.partial_rollout=true"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sync, asyn = proc.stdout.split("=== async run")
    assert "asynchronous: None" in sync
    assert "partial_rollout=True" in asyn


def test_summary_weights_the_lag_by_trained_samples():
    result = SimpleNamespace(
        eval_after={"val/accuracy": 0.5, "val/greedy/accuracy": 0.6}, step=2, wall_seconds=10.0,
        throughput={"samples_per_s": 4.0, "samples_trained": 24.0, "loop_seconds": 6.0},
    )  # fmt: skip
    rows = [
        {"async/lag_mean": 0.0, "async/lag_max": 0.0, "rollout/num_trajectories": 16,
         "async/dropped_stale_total": 0.0, "async/trainer_idle_s": 1.0},
        {"async/lag_mean": 1.0, "async/lag_max": 1.0, "rollout/num_trajectories": 8,
         "async/dropped_stale_total": 4.0, "async/trainer_idle_s": 0.0},
    ]  # fmt: skip
    s = run_summary(result, rows)
    assert s["samples_per_s"] == 4.0 and s["heldout_accuracy"] == 0.5
    assert s["lag_mean"] == pytest.approx(8 / 24, abs=1e-3) and s["lag_max"] == 1.0
    assert s["dropped_stale_samples"] == 4.0
    assert "lag_mean" not in run_summary(result, [])  # the synchronous run has no lag


def test_summary_gives_each_runs_gain_over_the_shared_pre_rl_evaluation():
    """Both runs' gains are over the one pre-RL evaluation, with their standard errors; the
    table prints them as `+gain (k SE)`."""
    from rl_app_async.compare import held_out, table_rows

    before = {
        "val/greedy/accuracy": 0.25,
        "val/greedy/num_prompts": 100.0,
        "val/accuracy": 0.2,
        "val/accuracy_se": 0.03,
        "val/num_prompts": 100.0,
    }
    after = {
        "val/greedy/accuracy": 0.5,
        "val/greedy/num_prompts": 100.0,
        "val/accuracy": 0.3,
        "val/accuracy_se": 0.04,
        "val/num_prompts": 100.0,
    }
    result = SimpleNamespace(eval_after=after, step=2, wall_seconds=10.0,
                             throughput={"samples_per_s": 4.0})  # fmt: skip
    s = run_summary(result, [], before)
    # greedy: a proportion over 100 prompts, se = sqrt((.25 * .75 + .5 * .5) / 100) = 0.0661
    assert s["gains"]["greedy"]["gain"] == 0.25
    assert s["gains"]["greedy"]["se"] == pytest.approx(0.0661, abs=1e-4)
    # sampled: the two evaluations' standard errors, sqrt(.03^2 + .04^2) = 0.05: 0.1 = 2 SE
    assert s["gains"]["sampled"]["se"] == pytest.approx(0.05) and s["gains"]["sampled"][
        "gain_in_se"
    ] == pytest.approx(2.0)
    assert "pass@k" not in s["gains"]  # neither evaluation has it
    assert run_summary(result, [])["gains"] == {}  # no pre-RL evaluation: no gain
    assert held_out(before) == {"greedy": 0.25, "sampled": 0.2}
    rows = table_rows({"max_staleness": 1, "sync": s, "async": s})
    assert rows["greedy gain"]["sync"] == "+0.250 (3.8 SE)"
    assert rows["sampled gain"]["async (max_staleness 1)"] == "+0.100 (2.0 SE)"
    assert rows["samples_per_s"] == {"sync": 4.0, "async (max_staleness 1)": 4.0}


def test_the_cpu_defaults_partial_rollout_is_left_out_without_ray(tmp_path):
    """The CPU default's asynchronous run takes weight updates into generations in flight,
    which needs Ray: with `rlvr_app.use_ray=false` the default leaves it out, while a user's
    own `async.partial_rollout=true` is still refused by name."""
    proc = run_in_process("async", ["--dry-run"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "partial_rollout=True" in proc.stdout.split("=== async run")[1]
    proc = run_in_process("async", ["--dry-run", "rlvr_app.use_ray=false"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "partial_rollout=False" in proc.stdout.split("=== async run")[1]
    # the user's own (the same text as the default's) stays, and both runs stop before any
    # starts: not after the synchronous one
    given = ["--dry-run", "rlvr_app.use_ray=false", "async.partial_rollout=true"]
    proc = run_in_process("async", given, tmp_path)
    assert proc.returncode == 1 and "async.partial_rollout: needs Ray" in proc.stderr
    assert "=== sync run" not in proc.stdout


def test_dry_run_shows_a_synchronous_and_an_asynchronous_plan(tmp_path):
    proc = subprocess.run([sys.executable, str(APP), "--dry-run"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    sync, asyn = proc.stdout.split("=== async run")
    assert "asynchronous: None" in sync
    assert "asynchronous: AsyncPlan(max_staleness=1" in asyn
    assert "actor_infer  strategy=hf_infer devices=[1]" in asyn


def test_each_run_logs_to_its_own_directory_even_with_tracker_kwargs_log_dir(tmp_path):
    """`tracker_kwargs.log_dir` overrides `logging_dir`: without the per-run override both runs
    would append to one metrics.jsonl and the lag figures (read per run) would be missing."""
    argv = ["--dry-run", f"tracker_kwargs.log_dir={tmp_path}/shared"]
    proc = run_in_process("async", argv, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sync, asyn = proc.stdout.split("=== async run")
    assert "kwargs={'log_dir': './output/async_cpu/sync/logs'}" in sync
    assert "kwargs={'log_dir': './output/async_cpu/async/logs'}" in asyn
    assert "shared" not in proc.stdout


def test_dry_run_takes_max_staleness_from_the_config_file_unless_overridden(tmp_path):
    """`--config FILE` with `async.max_staleness: 3`: the asynchronous run's bound is 3 (it was 1,
    the app's default, which beat the file); `async.max_staleness=2` on the command line wins."""
    import yaml

    data = yaml.safe_load((ROOT / "apps" / "rlvr" / "configs" / "cpu_default.yaml").read_text())
    data["num_gpus_per_node"] = 2
    data["actor_infer"]["device_mapping"] = [1]
    data["async"] = {"max_staleness": 3}
    config = tmp_path / "async.yaml"
    config.write_text(yaml.safe_dump(data))
    for extra, expected in (([], 3), (["async.max_staleness=2"], 2)):
        proc = run_in_process("async", ["--dry-run", "--config", str(config), *extra], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        sync, asyn = proc.stdout.split("=== async run")
        assert "asynchronous: None" in sync
        assert f"asynchronous: AsyncPlan(max_staleness={expected}," in asyn


def test_dry_run_of_a_config_with_async_generation_ratio_plans_both_runs(tmp_path):
    """ROLL's `async_generation_ratio: 2` in the file is the asynchronous run's bound
    (max_staleness 2); the synchronous run drops it. It failed: the synchronous run's
    max_staleness 0 contradicted the ratio (a config error naming `async.max_staleness=0`,
    an override the user never wrote)."""
    import yaml

    data = yaml.safe_load((ROOT / "apps" / "rlvr" / "configs" / "cpu_default.yaml").read_text())
    data["num_gpus_per_node"] = 2
    data["actor_infer"]["device_mapping"] = [1]
    data["async_generation_ratio"] = 2
    config = tmp_path / "ratio.yaml"
    config.write_text(yaml.safe_dump(data))
    proc = run_in_process("async", ["--dry-run", "--config", str(config)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sync, asyn = proc.stdout.split("=== async run")
    assert "asynchronous: None" in sync
    assert "asynchronous: AsyncPlan(max_staleness=2," in asyn


def test_dry_run_refuses_more_cpus_than_its_ray_cluster_holds(tmp_path):
    """Two device bundles of 2 CPUs on the 2 CPUs apps/async's Ray cluster has: the run would
    wait rpc_timeout (900 s) for placement groups that can never be placed."""
    proc = run_in_process("async", ["--dry-run", "rlvr_app.cpu_per_bundle=2"], tmp_path)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "placement: CPU: the placement needs 4 (2 device bundle(s) x cpu_per_bundle 2)" in (
        proc.stderr
    )


def test_a_reward_domain_no_scorer_can_score_is_listed_by_a_dry_run_and_refused_by_a_run(tmp_path):
    """apps/rlvr refuses such a domain before it starts; apps/async ran on and died with a
    traceback when the recipe built its scorer, after Ray and the workers had started."""
    judge = "rewards.judge.worker_cls=roll.GeneralRuleRewardWorker"  # IFEval
    for dry_run in (["--dry-run"], []):  # refused by name when the config is checked
        argv = [*dry_run, judge, f"output_dir={tmp_path}/out"]
        proc = run_in_process("async", argv, tmp_path)
        assert proc.returncode == 1, proc.stdout[-2000:]
        assert "rewards.judge.worker_cls: 'roll.GeneralRuleRewardWorker' is refused" in proc.stderr
        assert "Traceback" not in proc.stderr and "=== sync run" not in proc.stdout


def test_rlvr_trajectories_carry_the_engines_per_token_versions():
    """A generation that continued under newer weights (partial rollout) is as old as its
    oldest token: the RLVR recipe hands the engine's token_versions to the staleness filter."""
    from rl_config.records import GenerationResult, oldest_weight_version
    from rl_runtime.pipelines.rlvr.metrics import Group
    from rl_runtime.pipelines.rlvr.rollout import group_trajectories
    from rl_runtime.pipelines.rlvr.scoring import Scored

    def result(versions: list[int]) -> GenerationResult:
        return GenerationResult(request_id="0", prompt_ids=[1, 2], output_ids=[3, 4, 5],
                                output_log_probs=[-1.0] * 3, finish_reason="stop",
                                weight_version=7, token_versions=versions)  # fmt: skip

    row = SimpleNamespace(data_source="d", tag="d", index=0)
    ok = Scored(1.0, True, "ok")
    group = Group(row, [1, 2], [result([5, 6, 7]), result([])], ["a", "b"], [ok, ok], [1.0, 1.0])
    partial, whole = group_trajectories([group], step=0, max_len_mask=False)
    assert partial.token_versions == [7, 7, 5, 6, 7] and oldest_weight_version(partial) == 5
    assert whole.token_versions == [] and oldest_weight_version(whole) == 7


def test_each_run_moves_an_earlier_comparisons_summary_aside_when_it_starts_fresh(
    tmp_path, monkeypatch, capsys
):
    """output_dir/summary.json (both runs' figures) is the app's own file: it goes to each run
    as `app_outputs`, so the runner moves an earlier one into `previous-<UTC time>/` with that
    run's own outputs when the run starts fresh (rl_runtime.run.previous_run), instead of the
    comparison overwriting it. The runs themselves are recorded here, not trained."""
    from rl_app_async import spec as app_main
    from rl_app_rlvr import spec as rlvr_app

    calls = []

    def run(cfg, app, composed, flags=frozenset(), *, eval_before=None, app_outputs=()):
        calls.append((cfg.output_dir, app_outputs))
        return SimpleNamespace(
            eval_before={"val/accuracy": 0.25}, eval_after={"val/accuracy": 0.5}, step=1,
            wall_seconds=1.0, throughput={"samples_per_s": 2.0, "samples_trained": 2.0,
                                          "loop_seconds": 1.0},
        )  # fmt: skip

    monkeypatch.setattr(rlvr_app, "run", run)
    out = tmp_path / "cmp"
    assert app_main.main([f"output_dir={out}", "max_steps=1"]) == 0
    summary = str(out / "summary.json")
    assert calls == [(f"{out}/sync", (summary,)), (f"{out}/async", (summary,))]
    assert '"speedup": 1.0' in (out / "summary.json").read_text()
