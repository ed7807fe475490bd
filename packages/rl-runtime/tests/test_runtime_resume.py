"""Resuming a Runner's run (fake recipe and workers): first line, step, weight version, recipe
state, curves and metrics once per step, totals; changed seeds, estimators and keys refused,
harmless changes warned; earlier results set aside only once a run started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runtime_fakes import FakeEngine, FakeRecipe, FakeTrainer, _logged_steps, _run, _runner

from rl_config.errors import ConfigError
from rl_runtime.cluster.cluster import RoleSpec


def test_resume_continues_step_version_and_recipe_state(tmp_path, capsys):
    _run(tmp_path, FakeRecipe(), max_steps=3)
    capsys.readouterr()
    recipe = FakeRecipe()
    _, result = _run(tmp_path, recipe, max_steps=5, resume_from_checkpoint=True)
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("resuming from checkpoint") and "step 3 (weight version 3)" in first
    assert [s for kind, s in recipe.calls if kind == "step"] == [3, 4]
    assert recipe.counter == 5  # 3 restored + 2 new
    assert result.resumed_from is not None and result.weight_version == 5


def test_a_resumed_runs_curves_show_the_whole_run_once(tmp_path, monkeypatch):
    """curves.png of a resumed run plotted only the steps after the resume; now the checkpointed
    part comes from metrics.jsonl, without the interrupted run's steps past its checkpoint (lost,
    trained again): the uninterrupted run's points, each step once."""
    plotted = []
    monkeypatch.setattr(
        "rl_runtime.track.curves.write_curves", lambda history, path, **_: plotted.append(history)
    )
    _run(tmp_path / "full", FakeRecipe(), logging_steps=1, save_steps=3)
    with pytest.raises(RuntimeError, match="boom"):  # steps 1-4 logged, checkpoint at 3
        _run(tmp_path / "part", FakeRecipe(fail_at=4), logging_steps=1, save_steps=3)
    _run(
        tmp_path / "part", FakeRecipe(), logging_steps=1, save_steps=3, resume_from_checkpoint=True
    )

    def points(history: list[dict]) -> list[tuple[float, float]]:
        return [
            (r["step"], r[k]) for r in history for k in ("train/loss", "val/success_rate") if k in r
        ]

    full, resumed = plotted[0], plotted[-1]
    assert [p[0] for p in points(resumed) if p[0] > 0] == [1, 2, 2, 3, 4, 4, 5, 5]
    assert points(resumed) == points(full)


def test_a_resumed_runs_metrics_jsonl_holds_each_step_once(tmp_path, capsys):
    """metrics.jsonl held the steps the interrupted run logged past its checkpoint twice (once
    from each run); now a resume cuts it back to the checkpoint, says so, and keeps the
    interrupted file whole beside it."""
    _run(tmp_path / "full", FakeRecipe(), logging_steps=1, save_steps=3)
    with pytest.raises(RuntimeError, match="boom"):  # steps 1-4 logged, checkpoint at 3
        _run(tmp_path / "part", FakeRecipe(fail_at=4), logging_steps=1, save_steps=3)
    interrupted = (tmp_path / "part" / "out" / "logs" / "metrics.jsonl").read_text()
    capsys.readouterr()
    _run(
        tmp_path / "part", FakeRecipe(), logging_steps=1, save_steps=3, resume_from_checkpoint=True
    )
    out = capsys.readouterr().out.splitlines()
    assert "1 row(s) the interrupted run logged after step 3" in out[1]
    assert _logged_steps(tmp_path / "part") == _logged_steps(tmp_path / "full") == [1, 2, 3, 4, 5]
    (kept,) = (tmp_path / "part" / "out" / "logs").glob("previous-*/metrics.jsonl")
    assert kept.read_text() == interrupted
    assert str(kept.parent) in out[1]


def test_resume_refuses_changed_seed_and_estimator_before_anything_starts(tmp_path, capsys):
    _run(tmp_path, FakeRecipe(), max_steps=3)
    state = json.loads(
        (tmp_path / "out" / "checkpoints" / "step-000003" / "run_state.json").read_text()
    )
    assert state["extra"]["config"]["seed"] == 42  # the checkpoint records its config
    capsys.readouterr()
    recipe = FakeRecipe()
    runner = _runner(
        tmp_path,
        recipe,
        max_steps=5,
        resume_from_checkpoint=True,
        seed=7,
        adv_estimator="reinforce",
    )
    with pytest.raises(ConfigError) as info:
        runner.run()
    assert [i.path for i in info.value.issues] == ["seed", "adv_estimator"]
    assert "'grpo' in checkpoint" in info.value.issues[1].message
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("resuming from checkpoint") and "step-000003" in first
    assert recipe.calls == [] and runner.ctx is None  # no cluster, no step


def test_a_resumed_summary_keeps_the_checkpointed_evaluation_before_training(tmp_path):
    _, full = _run(tmp_path / "full", FakeRecipe(), max_steps=5)
    _run(tmp_path / "part", FakeRecipe(), max_steps=3)
    recipe = FakeRecipe()
    _, resumed = _run(tmp_path / "part", recipe, max_steps=5, resume_from_checkpoint=True)
    assert ("eval", 0) not in recipe.calls  # not evaluated again: carried by the checkpoint
    assert resumed.eval_before == full.eval_before == {"val/success_rate": 0.0}
    summary = json.loads((tmp_path / "part" / "out" / "summary.json").read_text())
    assert summary["eval_before"] == {"val/success_rate": 0.0}
    assert summary["eval_after"] == resumed.eval_after == full.eval_after


def test_resuming_a_finished_run_keeps_its_result(tmp_path):
    """Resumed from its last checkpoint (the same command again, or with max_steps unchanged), a
    finished run trains nothing and reports the final policy's evaluation again, logging no row
    twice. Before, summary.json's eval_after was overwritten with {} and the after-RL row and
    the recipe's summary (gains) were gone."""
    _, full = _run(tmp_path, FakeRecipe(), max_steps=4)
    recipe = FakeRecipe()
    _, again = _run(tmp_path, recipe, max_steps=4, resume_from_checkpoint=True)
    assert not [c for c in recipe.calls if c[0] == "step"]
    assert again.eval_after == full.eval_after == {"val/success_rate": 0.4}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["eval_after"] == {"val/success_rate": 0.4}
    assert _logged_steps(tmp_path) == [2, 4]


def test_resuming_past_max_steps_is_refused_naming_the_step_and_max_steps(tmp_path, capsys):
    """A checkpoint at step 4 resumed with max_steps 3 (lowered): before, a warning that
    max_steps changed, then nothing trained and a summary as if the run had ended at 3; now a
    ConfigError naming max_steps, the checkpoint and its step, before anything starts."""
    _run(tmp_path, FakeRecipe(), max_steps=4)
    recipe = FakeRecipe()
    runner = _runner(tmp_path, recipe, max_steps=3, resume_from_checkpoint=True)
    with pytest.raises(ConfigError) as info:
        runner.run()
    (issue,) = info.value.issues
    assert issue.path == "max_steps"
    assert "is 3, but checkpoint" in issue.message and "step-000004 is at step 4" in issue.message
    assert "raise max_steps above 4" in issue.message
    assert recipe.calls == [] and runner.ctx is None  # no cluster, no evaluation


def test_resuming_a_finished_run_says_it_trains_nothing(tmp_path, capsys):
    _run(tmp_path, FakeRecipe(), max_steps=4)
    capsys.readouterr()
    _run(tmp_path, FakeRecipe(), max_steps=4, resume_from_checkpoint=True)
    out = capsys.readouterr().out
    assert "is at max_steps=4: the run is finished and nothing is trained" in out
    assert "raise max_steps above 4" in out


class CountingRecipe(FakeRecipe):
    """Trains 4 samples a step (`rollout/num_trajectories`, what the runner's throughput counts)."""

    def step(self, ctx) -> dict[str, float]:
        return {**super().step(ctx), "rollout/num_trajectories": 4.0}


def test_a_resumed_run_reports_the_whole_runs_throughput_totals(tmp_path, capsys):
    """The checkpoint carries the trained samples and training-loop seconds so far: a run
    resumed at step 3 reports the uninterrupted run's totals, and its rate is over the whole
    run's loop seconds (the part before the interruption included), `"scope": "run"`."""
    _, full = _run(tmp_path / "full", CountingRecipe(), max_steps=5)
    _run(tmp_path / "part", CountingRecipe(), max_steps=3)
    state = json.loads(
        (tmp_path / "part" / "out" / "checkpoints" / "step-000003" / "run_state.json").read_text()
    )
    before = state["extra"]["throughput"]
    assert before["samples_trained"] == 12.0 and before["loop_seconds"] > 0
    _, resumed = _run(tmp_path / "part", CountingRecipe(), max_steps=5, resume_from_checkpoint=True)
    assert resumed.throughput["samples_trained"] == full.throughput["samples_trained"] == 20.0
    assert resumed.throughput["loop_seconds"] > before["loop_seconds"]
    assert resumed.throughput["samples_per_s"] == pytest.approx(
        20.0 / resumed.throughput["loop_seconds"])  # fmt: skip
    summary = json.loads((tmp_path / "part" / "out" / "summary.json").read_text())
    assert summary["throughput"] == resumed.throughput and summary["throughput"]["scope"] == "run"
    capsys.readouterr()
    runner = _runner(tmp_path / "old", CountingRecipe())
    runner.load_throughput_state(None, "ck/step-000003")  # a checkpoint from before: from 0
    assert runner.throughput_state() == {"samples_trained": 0.0, "loop_seconds": 0.0}
    assert "ck/step-000003 records no throughput totals" in capsys.readouterr().out


def test_the_app_section_is_recorded_and_checked_on_resume(tmp_path, capsys):
    app = {"rlvr_app": {"use_ray": False, "arith_data": {"seed": 0}}}
    _run(tmp_path, FakeRecipe(), {"app_record": app}, max_steps=3)
    state = json.loads(
        (tmp_path / "out" / "checkpoints" / "step-000003" / "run_state.json").read_text()
    )
    assert state["extra"]["app"] == app
    changed = {"rlvr_app": {"use_ray": True, "arith_data": {"seed": 1}}}
    runner = _runner(
        tmp_path, FakeRecipe(), {"app_record": changed}, max_steps=5, resume_from_checkpoint=True
    )
    with pytest.raises(ConfigError) as info:
        runner.run()
    assert [i.path for i in info.value.issues] == ["rlvr_app.arith_data.seed"]
    assert runner.ctx is None  # refused before anything started
    capsys.readouterr()
    harmless = {"rlvr_app": {"use_ray": True, "arith_data": {"seed": 0}}}
    _run(tmp_path, FakeRecipe(), {"app_record": harmless}, max_steps=5, resume_from_checkpoint=True)
    lines = capsys.readouterr().out.splitlines()
    assert any(x.startswith("warning: rlvr_app.use_ray changed since checkpoint") for x in lines)


def test_a_resume_refuses_the_changed_keys_the_pipeline_reads(tmp_path, capsys):
    """The runner checks a resume for the pipeline it runs (`RunOptions.pipeline`, else the
    config's kind): this agentic config does not read prompt_length (a warning), an RLVR run
    does (refused by name)."""
    _run(tmp_path, FakeRecipe(), max_steps=3)
    capsys.readouterr()
    _run(tmp_path, FakeRecipe(), max_steps=4, resume_from_checkpoint=True, prompt_length=64)
    lines = capsys.readouterr().out.splitlines()
    (line,) = [x for x in lines if x.startswith("warning: prompt_length changed")]
    assert "not read by the agentic pipeline" in line
    runner = _runner(
        tmp_path, FakeRecipe(), {"pipeline": "rlvr"}, max_steps=5, resume_from_checkpoint=True,
        prompt_length=32,
    )  # fmt: skip
    with pytest.raises(ConfigError) as info:
        runner.run()
    assert [i.path for i in info.value.issues] == ["prompt_length"]
    # the values the pipeline derives for its data are recorded and checked too
    _run(tmp_path / "derived", FakeRecipe(), {"derived": {"prompt_length": 56}}, max_steps=3)
    runner = _runner(
        tmp_path / "derived", FakeRecipe(), {"derived": {"prompt_length": 33}}, max_steps=5,
        resume_from_checkpoint=True,
    )  # fmt: skip
    with pytest.raises(ConfigError) as info:
        runner.run()
    assert [i.path for i in info.value.issues] == ["derived.prompt_length"]


def test_resume_warns_about_harmless_changes(tmp_path, capsys):
    _run(tmp_path, FakeRecipe(), max_steps=3)
    capsys.readouterr()
    _, result = _run(tmp_path, FakeRecipe(), max_steps=5, resume_from_checkpoint=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("resuming from checkpoint")
    assert any(x.startswith("warning: max_steps changed since checkpoint") for x in lines)
    assert not any("resume_from_checkpoint changed" in x for x in lines)
    assert result.step == 5


def test_a_fresh_run_moves_an_earlier_runs_results_aside(tmp_path, capsys):
    """A fresh run into an earlier run's directories first moves that run's metrics.jsonl,
    checkpoints and outputs (summary.json, curves.png, resolved_config.yaml, hf_model/, and a
    file the app writes for the run, `RunOptions.app_outputs`) into `previous-<UTC time>/` of
    the directory each was in (one line says what moved where), so its metrics and checkpoints
    are its own, a later resume continues it, not the earlier run's newest step, and nothing of
    the earlier run is overwritten; the resumed run goes on in the same metrics.jsonl, moving
    nothing."""
    out = tmp_path / "out"
    options = {"app_outputs": (str(tmp_path / "comparison.json"),)}
    _run(tmp_path, FakeRecipe(), options, max_steps=5)  # logs 2, 4, 5; checkpoints 3, 5
    (out / "hf_model").mkdir()  # as an export writes it (rl_runtime.cli.export)
    (out / "hf_model" / "config.json").write_text("{}")
    (tmp_path / "comparison.json").write_text("earlier comparison")  # the app's own file
    earlier_curves = (out / "curves.png").read_bytes()
    capsys.readouterr()
    _run(tmp_path, FakeRecipe(), options, max_steps=2)  # again, fresh: logs 2, checkpoint 2
    (logs_aside,) = (out / "logs").glob("previous-*")
    (ckpts_aside,) = (out / "checkpoints").glob("previous-*")
    (out_aside,) = out.glob("previous-*")
    (app_aside,) = tmp_path.glob("previous-*")
    assert logs_aside.name == ckpts_aside.name == out_aside.name == app_aside.name
    moved = [x for x in capsys.readouterr().out.splitlines() if "moved aside" in x]
    assert moved == [  # once the workers have started
        "this run starts fresh; an earlier run's results moved aside: metrics.jsonl -> "
        f"{logs_aside}/; step-000003, step-000005 -> {ckpts_aside}/; summary.json, "
        f"curves.png, resolved_config.yaml, hf_model -> {out_aside}/; "
        f"comparison.json -> {app_aside}/"
    ]
    assert _logged_steps(tmp_path) == [2]
    earlier = (logs_aside / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in earlier if "train/loss" in x] == [2, 4, 5]
    assert sorted(p.name for p in ckpts_aside.iterdir()) == ["step-000003", "step-000005"]
    assert [p.name for p in (out / "checkpoints").glob("step-*")] == ["step-000002"]
    assert json.loads((out_aside / "summary.json").read_text())["step"] == 5
    assert json.loads((out / "summary.json").read_text())["step"] == 2
    assert (out_aside / "curves.png").read_bytes() == earlier_curves
    assert "max_steps: 5" in (out_aside / "resolved_config.yaml").read_text()
    assert "max_steps: 2" in (out / "resolved_config.yaml").read_text()
    assert (out_aside / "hf_model" / "config.json").is_file()
    assert (app_aside / "comparison.json").read_text() == "earlier comparison"

    _, result = _run(tmp_path, FakeRecipe(), options, max_steps=4, resume_from_checkpoint=True)
    assert result.resumed_from == str(out / "checkpoints" / "step-000002")
    assert _logged_steps(tmp_path) == [2, 4]
    for directory in (out / "logs", out / "checkpoints", out, tmp_path):
        assert len(list(directory.glob("previous-*"))) == 1, directory


class FailingTrainer(FakeTrainer):
    def __init__(self, **_: object) -> None:
        raise RuntimeError("worker start failed")


class FailingStart(FakeRecipe):
    def roles(self, components):
        return [
            RoleSpec("actor_train", FailingTrainer, [0]),
            RoleSpec("actor_infer", FakeEngine, [0]),
        ]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_failed_start_leaves_every_earlier_file_in_place_and_a_later_resume_resumes(
    tmp_path, capsys
):
    """A fresh run whose workers fail to start moved the earlier run's checkpoints, metrics and
    outputs aside before failing, and the next `resume_from_checkpoint: true` started from step
    0; now nothing is moved or rewritten before the workers have started."""
    out = tmp_path / "out"
    _run(tmp_path, FakeRecipe(), max_steps=3)  # checkpoint 3, metrics, summary, config
    before = _files(out)
    with pytest.raises(RuntimeError, match="worker start failed"):
        _runner(tmp_path, FailingStart(), max_steps=5).run()
    assert not list(out.rglob("previous-*"))
    assert _files(out) == before  # not moved, not rewritten (resolved_config.yaml included)
    assert "moved aside" not in capsys.readouterr().out
    _, result = _run(tmp_path, FakeRecipe(), max_steps=5, resume_from_checkpoint=True)
    assert result.resumed_from == str(out / "checkpoints" / "step-000003")
    assert result.step == 5


def test_resume_with_no_checkpoint_says_in_its_first_line_that_it_starts_fresh(tmp_path, capsys):
    """`resume_from_checkpoint: true` with no checkpoint started from step 0 and said nothing;
    now its first line says so (and names earlier checkpoints set aside there)."""
    _run(tmp_path, FakeRecipe(), max_steps=2)
    _run(tmp_path, FakeRecipe(), max_steps=2)  # fresh again: the first run's step 2 set aside
    capsys.readouterr()
    aside = next((tmp_path / "out" / "checkpoints").glob("previous-*/step-000002"))
    for p in (tmp_path / "out" / "checkpoints").glob("step-*"):
        import shutil

        shutil.rmtree(p)
    _, result = _run(tmp_path, FakeRecipe(), max_steps=2, resume_from_checkpoint=True)
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("resume_from_checkpoint is set, but ")
    assert "holds no checkpoint: this run STARTS FRESH from step 0" in first
    assert str(aside) in first
    assert result.resumed_from is None and result.step == 2
