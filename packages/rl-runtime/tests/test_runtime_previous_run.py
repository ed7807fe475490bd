"""rl_runtime.run.previous_run: an earlier run's results moved aside, nothing lost."""

from __future__ import annotations

from datetime import datetime, timezone

from rl_runtime.run.previous_run import earlier_run_outputs, set_aside_previous_run
from rl_runtime.track.tracking import earlier_run_logs

WHEN = datetime(2026, 11, 24, 14, 5, 9, tzinfo=timezone.utc)


def test_each_directory_gets_one_previous_dir_named_for_the_moment(tmp_path):
    logs, ckpts = tmp_path / "logs", tmp_path / "ckpts"
    (logs / "tensorboard").mkdir(parents=True)
    (logs / "tensorboard" / "events.1").write_text("e")
    (logs / "metrics.jsonl").write_text('{"step": 1}\n')
    (logs / "notes.txt").write_text("kept")  # not the tracker's: stays
    (ckpts / "step-000004").mkdir(parents=True)
    (ckpts / "step-000004" / "run_state.json").write_text("{}")
    (logs / "previous-20261124T140509Z").mkdir()  # taken (an earlier move the same second)

    found = earlier_run_logs(logs)
    assert [p.name for p in found] == ["metrics.jsonl", "tensorboard"]
    line = set_aside_previous_run([*found, ckpts / "step-000004"], WHEN)
    logs_aside = logs / "previous-20261124T140509Z-1"
    ckpts_aside = ckpts / "previous-20261124T140509Z"
    assert line == (
        "this run starts fresh; an earlier run's results moved aside: metrics.jsonl, "
        f"tensorboard -> {logs_aside}/; step-000004 -> {ckpts_aside}/"
    )
    assert (logs_aside / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert (logs_aside / "tensorboard" / "events.1").read_text() == "e"
    assert (ckpts_aside / "step-000004" / "run_state.json").read_text() == "{}"
    assert sorted(p.name for p in logs.iterdir()) == [
        "notes.txt",
        "previous-20261124T140509Z",
        "previous-20261124T140509Z-1",
    ]
    assert earlier_run_logs(logs) == [] and set_aside_previous_run([], WHEN) is None


def test_a_runs_outputs_and_the_apps_files_are_found_and_moved_once(tmp_path):
    out = tmp_path / "out"
    (out / "hf_model").mkdir(parents=True)
    (out / "summary.json").write_text("{}")
    (out / "resolved_config.yaml").write_text("seed: 1\n")
    (out / "notes.txt").write_text("kept")  # not the runner's: stays
    extra = [str(tmp_path / "comparison.json"), str(tmp_path / "absent.json")]
    (tmp_path / "comparison.json").write_text("{}")

    found = earlier_run_outputs(out, [*extra, str(out / "summary.json")])
    assert [p.relative_to(tmp_path).as_posix() for p in found] == [
        "out/summary.json",
        "out/resolved_config.yaml",
        "out/hf_model",
        "comparison.json",
        "out/summary.json",  # named twice: moved once
    ]
    line = set_aside_previous_run(found, WHEN)
    assert line is not None and "summary.json, resolved_config.yaml, hf_model -> " in line
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "previous-20261124T140509Z"]
    assert (tmp_path / "previous-20261124T140509Z" / "comparison.json").is_file()
    assert earlier_run_outputs(out, extra) == []


def test_a_dangling_symlink_under_the_aside_name_is_passed_over(tmp_path):
    """`previous-<time>` taken by a dangling symlink: the name looked free (`exists()` follows
    the link) and the mkdir raised FileExistsError; the next name is used and the link left."""
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "previous-20261124T140509Z").symlink_to(tmp_path / "nowhere")
    line = set_aside_previous_run([tmp_path / "summary.json"], WHEN)
    assert (tmp_path / "previous-20261124T140509Z-1" / "summary.json").read_text() == "{}"
    assert line is not None and (tmp_path / "previous-20261124T140509Z").is_symlink()
