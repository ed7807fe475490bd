"""rl_runtime.run.runner.Runner with a fake recipe and in-process fake workers: cadence (the last
step logs, evaluates and saves), teardown after an exception, resume (first line, step, weight
version, recipe state; a changed seed or estimator refused), summary.json and the resolved
config; one run per output directory (two real processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rl_config.errors import ConfigError
from rl_config.schema import ExperimentConfig
from rl_runtime.cluster.cluster import RoleSpec
from rl_runtime.compose import compose
from rl_runtime.run.recipe import Recipe
from rl_runtime.run.run_lock import LOCK_NAME, RunDirectoryInUseError, run_directory_lock
from rl_runtime.run.runner import Runner, RunOptions


class FakeTrainer:
    def __init__(self, **_: object) -> None:
        self.w = torch.zeros(2)

    def ready(self) -> bool:
        return True

    def named_tensors(self, bucket_bytes: int = 0, host_copies: bool = True) -> list:
        return [("w", self.w.clone())]

    def save_checkpoint(
        self, root: str, step: int, extra: dict | None = None, key_file: str | None = None
    ) -> str:
        Path(root).mkdir(parents=True, exist_ok=True)
        (Path(root) / "step.txt").write_text(str(step))
        return root

    def load_checkpoint(self, root: str, key_file: str | None = None) -> tuple[int, dict]:
        return int((Path(root) / "step.txt").read_text()), {}

    def export_hf(self, out: str) -> str:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "config.json").write_text(json.dumps({"step": self.w.tolist()}))
        return out

    def offload(self) -> None: ...

    def onload(self) -> None: ...

    def shutdown(self) -> None: ...


class FakeEngine:
    def __init__(self, **_: object) -> None:
        self.version = 0

    def ready(self) -> bool:
        return True

    def update_weights(self, named: list, version: int) -> int:
        self.version = version
        return version

    def weight_version(self) -> int:
        return self.version

    def sleep(self, level: int = 1) -> None: ...

    def wake_up(self) -> None: ...

    def shutdown(self) -> None: ...


class FakeRecipe(Recipe):
    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.calls: list[tuple[str, int]] = []
        self.counter = 0

    def roles(self, components):
        return [
            RoleSpec("actor_train", FakeTrainer, [0]),
            RoleSpec("actor_infer", FakeEngine, [0]),
        ]

    def step(self, ctx) -> dict[str, float]:
        if ctx.step == self.fail_at:
            raise RuntimeError("boom")
        self.counter += 1
        self.calls.append(("step", ctx.step))
        ctx.sync_weights()
        return {"train/loss": float(ctx.step)}

    def evaluate(self, ctx) -> dict[str, float]:
        self.calls.append(("eval", ctx.step))
        return {"val/success_rate": ctx.step / 10}

    def state(self) -> dict:
        return {"counter": self.counter}

    def load_state(self, state: dict) -> None:
        self.counter = state["counter"]


def _runner(
    tmp_path: Path, recipe: FakeRecipe, run_options: dict | None = None, **extra: object
) -> Runner:
    data = {
        "pretrain": "unused",
        "output_dir": str(tmp_path / "out"),
        "logging_dir": str(tmp_path / "out" / "logs"),
        "track_with": "stdout",
        "max_steps": 5,
        "eval_steps": 2,
        "save_steps": 3,
        "logging_steps": 2,
        "rollout_batch_size": 2,
        "train_env_manager": {"num_env_groups": 1, "group_size": 2, "tags": ["FL"]},
        "custom_envs": {"FL": {"env_type": "frozen_lake"}},
        **extra,
    }
    cfg = ExperimentConfig.model_validate(data)
    options = RunOptions(model_path="unused", use_ray=False, **(run_options or {}))
    return Runner(cfg, compose(cfg), recipe, options)


def _run(tmp_path: Path, recipe: FakeRecipe, run_options: dict | None = None, **extra: object):
    runner = _runner(tmp_path, recipe, run_options, **extra)
    return runner, runner.run()


def _logged_steps(tmp_path: Path) -> list[int]:
    lines = (tmp_path / "out" / "logs" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["step"] for x in lines if "train/loss" in json.loads(x)]


def test_cadence_summary_and_resolved_config(tmp_path):
    recipe = FakeRecipe()
    _, result = _run(tmp_path, recipe)
    evals = [s for kind, s in recipe.calls if kind == "eval"]
    assert evals == [0, 2, 4, 5]  # before training, every eval_steps, and the last step
    assert _logged_steps(tmp_path) == [2, 4, 5]  # logging_steps 2, and the last step
    ckpts = sorted(p.name for p in (tmp_path / "out" / "checkpoints").iterdir())
    assert ckpts == ["step-000003", "step-000005"]  # save_steps 3, and the last step
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["step"] == 5 and summary["weight_version"] == 5
    assert summary["eval_before"] == {"val/success_rate": 0.0}
    assert summary["eval_after"] == {"val/success_rate": 0.5}
    assert (tmp_path / "out" / "resolved_config.yaml").exists()
    assert result.resumed_from is None


def test_eval_steps_zero_never_evaluates(tmp_path):
    """`eval_steps: 0` means never (the schema's promise): not before training, not at the
    last step; the summary has no evaluation to report."""
    recipe = FakeRecipe()
    _run(tmp_path, recipe, eval_steps=0)
    assert [s for kind, s in recipe.calls if kind == "eval"] == []
    assert [s for kind, s in recipe.calls if kind == "step"] == [0, 1, 2, 3, 4]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["eval_before"] == {} and summary["eval_after"] == {}


def test_teardown_after_an_exception(tmp_path):
    runner = _runner(tmp_path, FakeRecipe(fail_at=2))
    seen = {}
    original = runner.teardown

    def teardown() -> None:
        seen["cluster"], seen["tracker"] = runner.ctx.cluster, runner.ctx.tracker
        original()

    runner.teardown = teardown
    with pytest.raises(RuntimeError, match="boom"):
        runner.run()
    assert runner.ctx is None and seen["cluster"].groups == {}  # workers shut down
    assert seen["tracker"].backends == []  # the tracker was closed
    assert _logged_steps(tmp_path) == [2]  # the third step failed; step 2 was logged


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


class SummarisingRecipe(FakeRecipe):
    """Evaluates to success 0 before training and 1 after (a gain with a standard error of 0,
    `gain_in_se` inf) and reports a NaN figure."""

    def evaluate(self, ctx) -> dict[str, float]:
        return {"val/success_rate": float(ctx.step > 0), "val/reward": float("nan")}

    def summary(self, before: dict, after: dict) -> dict:
        from rl_runtime.pipelines.agentic.gain import success_gains

        return success_gains(before, after, ("val/success_rate",), n=8)


def test_summary_json_is_standard_json_with_null_for_non_finite_figures(tmp_path):
    """summary.json held `Infinity` (a 0 -> 1 gain's gain_in_se) and `NaN`, which JSON does not
    have: jq and JavaScript refuse the file. Now they are null; the finite figures stay."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not standard JSON: {constant}")

    _, result = _run(tmp_path, SummarisingRecipe())
    assert result.summary["gain val/success_rate"]["gain_in_se"] == float("inf")
    text = (tmp_path / "out" / "summary.json").read_text()
    summary = json.loads(text, parse_constant=refuse)
    assert summary["summary"]["gain val/success_rate"] == {
        "gain": 1.0, "se": 0.0, "gain_in_se": None, "n": 8
    }  # fmt: skip
    assert summary["eval_after"] == {"val/success_rate": 1.0, "val/reward": None}
    assert not list((tmp_path / "out").glob("*.tmp"))


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


class RecipeWithBaselines(FakeRecipe):
    def baselines(self, ctx) -> dict:
        return {"blind": {"val/success_rate": 0.125}}

    def summary(self, before: dict, after: dict) -> dict:
        return {"gain": after["val/success_rate"] - before["val/success_rate"]}


def test_baselines_and_summary_reach_summary_json_and_the_table(tmp_path, capsys):
    from rl_runtime.run.runner import print_result

    _, result = _run(tmp_path, RecipeWithBaselines())
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["baselines"] == {"blind": {"val/success_rate": 0.125}}
    assert summary["summary"] == {"gain": 0.5}
    # without a terminal (pytest captures stderr) every step prints one line with its phases
    assert "step 5/5 |" in capsys.readouterr().out
    print_result(result, "t", lambda m: {"success": m["val/success_rate"]}, before_label="warm")
    table = capsys.readouterr().out
    assert table.index("blind") < table.index("warm") < table.index("after RL")
    assert "0.125" in table and "gain: 0.5" in table


def _two_device_config(**roles: list[int]) -> ExperimentConfig:
    mapped = {role: {"device_mapping": devices} for role, devices in roles.items()}
    return ExperimentConfig.model_validate({
        "pretrain": "tiny", "num_gpus_per_node": 2, "rollout_batch_size": 4,
        "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["FL"]},
        "val_env_manager": {"num_env_groups": 2, "group_size": 1, "tags": ["FL"]},
        "custom_envs": {"FL": {"env_type": "frozen_lake", "max_steps": 4}},
        **mapped,
    })  # fmt: skip


def test_without_ray_a_training_role_of_several_ranks_is_refused_by_name():
    """--no-ray puts every worker in one process: a 2-rank actor_train used to wait for its
    second rank until rpc_timeout (900 s in the CPU defaults), then fail with a hint to raise it."""
    from rl_runtime.run.runner import check_in_process

    two_ranks = compose(_two_device_config(actor_train=[0, 1], actor_infer=[0]))
    with pytest.raises(ConfigError, match=r"actor_train\.device_mapping: 2 ranks") as err:
        check_in_process(two_ranks, use_ray=False)
    assert "actor_infer" not in str(err.value)
    check_in_process(two_ranks, use_ray=True)  # Ray gives each rank its own process
    # rollout workers hold no process group: two engines in one process are fine
    check_in_process(compose(_two_device_config(actor_train=[0], actor_infer=[0, 1])), False)


def test_without_ray_partial_rollout_is_refused_by_name_before_anything_starts():
    """`async.partial_rollout` with --no-ray was refused only when asynchronous training
    started, after the warm-up and the pre-RL evaluation, as a traceback."""
    from rl_runtime.run.runner import check_in_process

    cfg = _two_device_config(actor_train=[0], actor_infer=[1])
    data = {**cfg.model_dump(exclude_unset=True), "async": {"max_staleness": 1}}
    partial = compose(ExperimentConfig.model_validate(
        {**data, "async": {"max_staleness": 1, "partial_rollout": True}}))  # fmt: skip
    with pytest.raises(ConfigError, match=r"async\.partial_rollout: needs Ray"):
        check_in_process(partial, use_ray=False)
    check_in_process(partial, use_ray=True)
    check_in_process(compose(ExperimentConfig.model_validate(data)), use_ray=False)


def test_without_ray_the_keys_only_ray_reads_are_warned_about_by_name():
    from rl_runtime.run.runner import check_in_process

    cfg = _two_device_config(actor_train=[0], actor_infer=[1])
    assert check_in_process(compose(cfg), use_ray=False) == []
    pinned = ExperimentConfig.model_validate({
        **cfg.model_dump(exclude_unset=True), "num_gpus_per_node": 1, "num_nodes": 2,
        "node_resources": ["trainer_node", "rollout_node"], "weight_sync_host": "10.0.0.5",
    })  # fmt: skip
    warnings = check_in_process(compose(pinned), use_ray=False)
    assert len(warnings) == 2
    assert warnings[0].startswith("node_resources=('trainer_node', 'rollout_node') has no effect")
    assert warnings[1].startswith("weight_sync_host='10.0.0.5' has no effect without Ray")
    assert check_in_process(compose(pinned), use_ray=True) == []
    data = cfg.model_dump(exclude_unset=True)
    for mb, expected in (
        (64, ["model_update_buffer_size_mb=64 has no effect without Ray"]),
        (1024, []),
    ):  # fmt: skip  (1024: the default)
        sized = ExperimentConfig.model_validate({**data, "model_update_buffer_size_mb": mb})
        found = check_in_process(compose(sized), use_ray=False)
        assert [w.split(" (--no-ray)")[0] for w in found] == expected
        assert check_in_process(compose(sized), use_ray=True) == []


# ------------------------------------------------------------ one run per output directory
# rl_runtime.run.run_lock, with two real processes: a second Runner on a directory a live run holds
# fails at once, naming the directory and the holder's pid, before it moves or writes anything
# there; the lock goes with the holder (finished or killed).
TESTS = Path(__file__).resolve().parent

# a Runner (test_runtime_pipeline's fake recipe and workers) that holds at step 1 until told
HOLDING_RUN = """
import time
from pathlib import Path
from test_runtime_pipeline import FakeRecipe, _runner

class Holding(FakeRecipe):
    def step(self, ctx):
        if ctx.step == 1:
            Path({started!r}).touch()
            while not Path({release!r}).exists():
                time.sleep(0.05)
        return super().step(ctx)

_runner(Path({root!r}), Holding(), **{extra!r}).run()
"""


def _start_holding_run(tmp_path: Path, **extra: object) -> tuple[subprocess.Popen[bytes], Path]:
    started, release = tmp_path / "started", tmp_path / "release"
    script = HOLDING_RUN.format(
        started=str(started),
        release=str(release),
        root=str(tmp_path),
        extra=extra,
    )
    # `python -c` imports from its working directory: this test module, as the child's
    child = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, cwd=TESTS)
    deadline = time.monotonic() + 120
    while not started.exists():
        if child.poll() is not None:
            raise AssertionError(f"the holding run exited: {child.stderr.read().decode()}")  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the holding run did not reach step 1"
        time.sleep(0.1)
    return child, release


def test_a_second_run_on_a_live_runs_output_dir_fails_naming_it_and_the_pid(tmp_path):
    out = tmp_path / "out"
    child, release = _start_holding_run(tmp_path)
    try:
        config_before = (out / "resolved_config.yaml").read_bytes()
        with pytest.raises(RunDirectoryInUseError) as caught:
            _runner(tmp_path, FakeRecipe()).run()
        message = str(caught.value)
        assert str(out.resolve()) in message and f"pid {child.pid}" in message
        # refused before touching the directory: nothing moved aside, nothing rewritten
        assert not list(out.glob("previous-*"))
        assert (out / "resolved_config.yaml").read_bytes() == config_before
        release.touch()
        assert child.wait(timeout=120) == 0
    finally:
        child.kill()
        child.wait()
    assert (out / "summary.json").exists()  # the first run finished undisturbed
    _runner(tmp_path, FakeRecipe()).run()  # its lock went with it: the directory is free


def test_a_second_run_sharing_only_the_checkpoint_dir_fails_naming_it(tmp_path):
    """Different output dirs, one checkpoint_config.output_dir outside both: the second run is
    refused on the checkpoint directory before it writes a checkpoint there, and the first
    run's checkpoints are its own."""
    shared = {"checkpoint_config": {"output_dir": str(tmp_path / "shared_checkpoints")}}
    child, release = _start_holding_run(tmp_path, **shared)
    second = tmp_path / "second"
    try:
        with pytest.raises(RunDirectoryInUseError) as caught:
            _runner(second, FakeRecipe(), **shared).run()
        message = str(caught.value)
        assert str((tmp_path / "shared_checkpoints").resolve()) in message
        assert f"pid {child.pid}" in message
        assert not (second / "out" / "resolved_config.yaml").exists()  # refused before writing
        release.touch()
        assert child.wait(timeout=120) == 0
    finally:
        child.kill()
        child.wait()
    _runner(second, FakeRecipe(), **shared).run()  # both locks went with the first run
    assert (second / "out" / "summary.json").exists()


def test_a_checkpoint_dir_inside_the_output_dir_takes_one_lock(tmp_path):
    from rl_runtime.run.run_lock import directories_to_lock

    out = tmp_path / "out"
    assert directories_to_lock(out, out / "checkpoints") == [out.resolve()]
    assert directories_to_lock(out, tmp_path / "ckpt") == [
        out.resolve(),
        (tmp_path / "ckpt").resolve(),
    ]


def test_a_killed_runs_lock_is_released_by_the_os(tmp_path):
    child, _ = _start_holding_run(tmp_path)
    with (
        pytest.raises(RunDirectoryInUseError, match=f"pid {child.pid}"),
        run_directory_lock(tmp_path / "out"),
    ):
        pass
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=60)
    assert (tmp_path / "out" / LOCK_NAME).exists()  # the file stays; the lock does not
    with run_directory_lock(tmp_path / "out") as lock_file:
        assert lock_file.read_text() == f"{os.getpid()}\n"


def test_the_lock_is_released_when_the_run_raises(tmp_path):
    with pytest.raises(ValueError, match="inside"), run_directory_lock(tmp_path / "new" / "dir"):
        raise ValueError("inside")
    with run_directory_lock(tmp_path / "new" / "dir"):
        pass


def test_a_symlink_under_the_lock_name_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / LOCK_NAME).symlink_to(target)
    with pytest.raises(OSError), run_directory_lock(tmp_path / "out"):
        pass
    assert target.read_text() == "keep me"


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


class SkippingRecipe(FakeRecipe):
    """Dynamic sampling kept no group at the steps in `skip` (`None`: every step)."""

    def __init__(self, skip: set[int] | None = None) -> None:
        super().__init__()
        self.skip = skip

    def step(self, ctx) -> dict[str, float]:
        if self.skip is None or ctx.step in self.skip:
            return {"train/skipped": 1.0, "dynamic_sampling/kept_groups": 0.0}
        return super().step(ctx)


def test_a_step_that_kept_no_group_says_skipped_and_is_counted(tmp_path, capsys):
    from rl_runtime.run.runner import print_result

    _, result = _run(tmp_path, SkippingRecipe({1, 3}))
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.startswith("step ") and "/5 |" in x]
    assert len(lines) == 5
    assert [("skipped (no group kept)" in x) for x in lines] == [False, True, False, True, False]
    assert result.skipped_steps == 2
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["skipped_steps"] == 2 and summary["step"] == 5
    print_result(result, "t", lambda m: m)
    assert "skipped steps: 2 of 5 trained on nothing" in capsys.readouterr().out


def test_skipped_steps_are_the_whole_runs_across_a_resume(tmp_path):
    _run(tmp_path, SkippingRecipe({0}), max_steps=3)
    _, result = _run(tmp_path, SkippingRecipe({4}), max_steps=5, resume_from_checkpoint=True)
    assert result.skipped_steps == 2  # one before the checkpoint at step 3, one after


def test_a_run_that_trained_on_nothing_ends_with_an_error(tmp_path):
    from rl_runtime.run.runner import NothingTrainedError

    with pytest.raises(NothingTrainedError, match="every one of the run's 5 steps was skipped"):
        _run(tmp_path, SkippingRecipe())
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["skipped_steps"] == 5  # the summary says so too


class SignalledRecipe(FakeRecipe):
    """Sends `signum` to its own process at step `at` (the driver's main thread handles it)."""

    def __init__(self, signum: int, at: int) -> None:
        super().__init__()
        self.signum, self.at = signum, at

    def step(self, ctx) -> dict[str, float]:
        if ctx.step == self.at:
            os.kill(os.getpid(), self.signum)
            time.sleep(5)  # the handler raises before this ends
        return super().step(ctx)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_the_run_in_order_with_the_last_durable_checkpoint(tmp_path, signum, code):
    from rl_runtime.run import interrupts
    from rl_runtime.run.interrupts import RunInterrupted

    monkey_command = ("uv", "run", "apps/x", "max_steps=5", "resume_from_checkpoint=false")
    interrupts._command = monkey_command
    try:
        runner = _runner(tmp_path, SignalledRecipe(signum, at=4))  # saved at step 3
        before = signal.getsignal(signum)
        with pytest.raises(RunInterrupted) as info:
            runner.run()
    finally:
        interrupts._command = None
    exc = info.value
    assert exc.exit_code == code and runner.ctx is None  # workers stopped
    assert signal.getsignal(signum) is before  # the handler was put back
    ckpt = str(tmp_path / "out" / "checkpoints" / "step-000003")
    assert exc.step == 4 and exc.checkpoint == ckpt
    assert exc.resume_command == f"uv run apps/x max_steps=5 resume_from_checkpoint={ckpt}"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["interrupted"] == signal.Signals(signum).name and summary["step"] == 4
    assert summary["last_checkpoint"] == ckpt and summary["resume_command"] == exc.resume_command
    report = exc.report()
    assert f"last durable checkpoint: {ckpt}" in report and "resume with: uv run" in report


def test_the_last_line_and_summary_say_where_everything_went(tmp_path, capsys, monkeypatch):
    """The run's last line lists where checkpoints, logs, TensorBoard, curves, summary and the
    exported model went (before: curves and hf_model only); summary.json records them. The
    model is exported from the last checkpoint (rl_runtime.cli.export, what `rl-export` runs; the
    fake trainer's checkpoints hold no model, so a stand-in writes it)."""
    from rl_runtime.run.runner import print_result

    exported = []

    def export_checkpoint(checkpoint, out_dir, **_):
        exported.append(checkpoint)
        Path(out_dir).mkdir(parents=True)
        return Path(out_dir)

    monkeypatch.setattr("rl_runtime.cli.export.export_checkpoint", export_checkpoint)
    out = tmp_path / "out"
    _, result = _run(tmp_path, FakeRecipe(), {"export_hf": True}, max_steps=2)
    assert exported == [str(out / "checkpoints" / "step-000002")]
    capsys.readouterr()
    print_result(result, "t", lambda m: m)
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == (
        f"outputs: checkpoints={out / 'checkpoints'} logs={out / 'logs'} tensorboard=not tracked "
        f"curves={out / 'curves.png'} summary={out / 'summary.json'} hf_model={out / 'hf_model'}"
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outputs"]["checkpoints"] == str(out / "checkpoints")


def test_a_key_named_by_the_config_is_hidden_from_sandboxed_calls(tmp_path, monkeypatch):
    """Only `$RL_CHECKPOINT_KEY_FILE` and the default location were hidden: a key named by
    `checkpoint_config.key_file` was readable by a non-root call. The run now passes it to the
    sandbox pools of the driver and of every worker (`RL_SANDBOX_HIDE`)."""
    from rl_envs.sandbox.credentials import HIDE_VARIABLE, secret_paths
    from rl_runtime.run.runner import sandbox_hidden_env

    monkeypatch.delenv(HIDE_VARIABLE, raising=False)
    monkeypatch.setenv(HIDE_VARIABLE, "")  # restored after the test
    key = tmp_path / "keys" / "run.key"
    _run(tmp_path, FakeRecipe(), max_steps=1, checkpoint_config={"key_file": str(key)})
    assert key.exists()
    assert str(key) in sandbox_hidden_env()[HIDE_VARIABLE].split(os.pathsep)
    assert str(key) in secret_paths()
