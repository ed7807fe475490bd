import io
import json
import math

import pytest

from rl_runtime.track.timing import PhaseTimer
from rl_runtime.track.tracking import Tracker, read_metrics, rewind_metrics


def test_tracker_writes_jsonl_stdout_and_tensorboard(tmp_path):
    stream = io.StringIO()
    tracker = Tracker(["stdout", "tensorboard"], tmp_path, stream=stream)
    tracker.log({"train/loss": 0.5, "env/success_rate": 0.25}, step=1)
    tracker.log({"train/loss": float("nan")}, step=2)
    tracker.close()
    rows = read_metrics(tmp_path)
    assert rows[0] == {"step": 1, "train/loss": 0.5, "env/success_rate": 0.25}
    assert rows[1]["step"] == 2 and math.isnan(rows[1]["train/loss"])
    assert "step 1 | env/success_rate=0.25 train/loss=0.5" in stream.getvalue()
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_a_resumed_tracker_hides_the_interrupted_runs_later_tensorboard_points(tmp_path):
    """TensorBoard showed a resumed run's steps past its checkpoint twice (the interrupted
    run's points and the new ones); `resumed_at` purges the interrupted run's from step+1 on."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = Tracker("tensorboard", tmp_path, stream=io.StringIO())
    for step in (1, 2, 3, 4):  # interrupted after step 4, checkpoint at 2
        first.log({"train/loss": float(step)}, step=step)
    first.close()
    resumed = Tracker("tensorboard", tmp_path, stream=io.StringIO(), resumed_at=2)
    for step in (3, 4, 5):
        resumed.log({"train/loss": 10.0 * step}, step=step)
    resumed.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    points = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert points == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0)]


def test_a_last_line_cut_short_by_a_kill_is_dropped_on_resume(tmp_path):
    """A kill during a write leaves `{"step": 4, "tr` without a newline: reading the file
    raised, and the resumed run would have appended its next row to that line. The resume
    cuts it off (the interrupted file is kept); a broken line elsewhere is still an error."""
    log = tmp_path / "metrics.jsonl"
    whole = "".join(json.dumps({"step": s, "train/loss": s / 10}) + "\n" for s in (1, 2, 3))
    log.write_text(whole + '{"step": 4, "tr')
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    rows, line = rewind_metrics(tmp_path, 3)
    assert [r["step"] for r in rows] == [1, 2, 3] and log.read_text() == whole
    assert line is not None and "dropped its last line, cut short" in line
    (kept,) = tmp_path.glob("previous-*/metrics.jsonl")
    assert kept.read_text().endswith('{"step": 4, "tr')
    assert rewind_metrics(tmp_path, 3) == (rows, None)  # nothing left to cut
    log.write_text('{"step": 1, "tr\n' + whole)
    with pytest.raises(ValueError, match="metrics.jsonl:1: not JSON"):
        read_metrics(tmp_path)


def test_tracker_rejects_unprefixed_names_and_unknown_backend(tmp_path):
    tracker = Tracker("jsonl", tmp_path)
    with pytest.raises(ValueError, match="'loss' has no known prefix"):
        tracker.log({"loss": 1.0}, step=0)
    tracker.close()
    with pytest.raises(ValueError, match="unknown backend"):
        Tracker("mlflow", tmp_path)


def test_tracker_kwargs_log_dir_wins(tmp_path):
    tracker = Tracker("jsonl", tmp_path / "a", {"log_dir": str(tmp_path / "b")})
    tracker.log({"sync/seconds": 0.1}, step=0)
    tracker.close()
    assert read_metrics(tmp_path / "b")[0]["sync/seconds"] == 0.1


def test_tracker_kwargs_only_wandb_reads_are_warned_about_by_name():
    from rl_config import ExperimentConfig
    from rl_runtime.compose.run_settings import build_tracker

    def warnings(track_with, kwargs):
        cfg = ExperimentConfig.model_validate(
            {"pretrain": "m", "track_with": track_with, "tracker_kwargs": kwargs}
        )
        out: list[str] = []
        settings = build_tracker(cfg, out)
        assert settings.kwargs == kwargs  # passed on unchanged
        return out

    kwargs = {"project": "p", "log_dir": "/tmp/x", "name": "n"}
    for track_with in ("stdout", "tensorboard"):
        found = warnings(track_with, kwargs)
        assert [w.split(" has no effect")[0] for w in found] == [
            "tracker_kwargs.project='p'",
            "tracker_kwargs.name='n'",
        ]
        assert "reads only tracker_kwargs.log_dir" in found[0]
    assert warnings("wandb", kwargs) == []
    assert warnings("tensorboard", {"log_dir": "/tmp/x"}) == []


def test_phase_timer_accumulates():
    timer = PhaseTimer()
    for _ in range(2):
        with timer.phase("rollout"):
            pass
    with timer.phase("train"):
        pass
    m = timer.metrics()
    assert set(m) == {"timing/rollout", "timing/train", "timing/step"}
    assert m["timing/step"] == pytest.approx(m["timing/rollout"] + m["timing/train"])


@pytest.mark.parametrize("row", ["[1, 2]", '{"step": "3"}', '{"loss": 1}', "7"])
def test_a_row_that_is_no_metrics_object_is_an_error_naming_its_line(tmp_path, row):
    """Rows the resume compares by `step`: one that is not an object with a numeric step was
    an AttributeError/TypeError traceback in `rewind_metrics`."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n' + row + '\n{"step": 2}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2: not a metrics row"):
        rewind_metrics(tmp_path, 1)


def test_outputs_are_not_written_through_a_symlink_planted_as_their_temporary_file(tmp_path):
    """summary.json and a rewound metrics.jsonl were written to `<name>.tmp`, a fixed name:
    a symlink planted under it (by anything that could write the output directory) had the
    run overwrite the file it points to."""
    from rl_runtime.track.summary_json import write_summary

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "summary.json.tmp").symlink_to(victim)
    (tmp_path / "metrics.jsonl.tmp").symlink_to(victim)
    write_summary(tmp_path / "summary.json", {"final": 1.0})
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    rows, line = rewind_metrics(tmp_path, 1)
    assert victim.read_text() == "keep me"
    assert json.loads((tmp_path / "summary.json").read_text()) == {"final": 1.0}
    assert rows == [{"step": 1}] and (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'
    (kept,) = tmp_path.glob("previous-*/metrics.jsonl")
    assert kept.read_text() == '{"step": 1}\n{"step": 2}\n' and line is not None
