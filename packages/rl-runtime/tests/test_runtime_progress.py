"""The per-step progress line without a terminal, and curves with baseline lines."""

from __future__ import annotations

import io

from rl_runtime.track.curves import write_curves
from rl_runtime.track.timing import StepProgress


def test_one_line_per_step_without_a_terminal():
    buf = io.StringIO()
    with StepProgress(3, stream=buf) as progress:  # pytest's stderr is not a terminal
        progress.advance({"timing/rollout": 1.5, "timing/step": 2.0}, "env/success_rate=0.500")
        progress.advance({"timing/rollout": 1.0, "timing/step": 1.0}, "")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("step 1/3 | env/success_rate=0.500 | rollout=1.5s |")
    assert lines[1].startswith("step 2/3 |") and "step=" not in lines[1]


def test_curves_draw_baselines_only_on_their_metric(tmp_path, monkeypatch):
    import matplotlib.axes

    drawn = []
    original = matplotlib.axes.Axes.axhline

    def axhline(self, y=0, *args, **kwargs):
        drawn.append((self.get_title(), y))
        return original(self, y, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "axhline", axhline)
    history = [{"step": 1, "env/success_rate": 0.1}, {"step": 2, "val/success_rate": 0.4}]
    png = write_curves(
        history, tmp_path / "c.png", baselines={"random policy: val/success_rate": 0.05}
    )
    assert png.stat().st_size > 0
    assert len(drawn) == 1 and drawn[0][1] == 0.05


def test_summary_table_has_every_rows_columns():
    from rich.console import Console

    from rl_runtime.track.timing import summary_table

    rows = {"baseline": {"sampled": 0.2}, "after": {"sampled": 0.5, "greedy": 0.7}}
    console = Console(width=120, record=True)
    console.print(summary_table("t", rows))
    text = console.export_text()
    assert "greedy" in text and "0.700" in text and "0.200" in text


def test_a_long_phase_prints_plain_progress_lines_and_a_short_one_nothing():
    import time

    from rl_runtime.track.timing import long_phase

    buf = io.StringIO()
    with long_phase("evaluation", after_s=0.05, every_s=0.1, stream=buf):
        time.sleep(0.32)
    lines = buf.getvalue().splitlines()
    assert 2 <= len(lines) <= 5, lines
    assert all(x.startswith("evaluation: running, ") for x in lines[:-1])
    assert lines[-1].startswith("evaluation: done in ")
    quiet = io.StringIO()
    with long_phase("evaluation", after_s=5.0, stream=quiet):
        pass
    assert quiet.getvalue() == ""


def _plotted(monkeypatch):
    import matplotlib.axes

    drawn = []
    original = matplotlib.axes.Axes.plot

    def plot(self, *args, **kwargs):
        drawn.append((self, kwargs.get("label"), kwargs.get("linestyle", "-")))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    return drawn


def test_rlvr_curves_show_the_batch_before_dynamic_sampling_and_held_out_accuracy(
    tmp_path, monkeypatch
):
    from rl_runtime.track.curves import PANELS

    drawn = _plotted(monkeypatch)
    history = [
        {"step": 1, "env/success_rate": 0.5, "reward/accuracy": 0.1, "reward/mean": 0.1},
        {"step": 2, "env/success_rate": 0.6, "reward/accuracy": 0.2, "reward/mean": 0.2,
         "val/greedy/accuracy": 0.3, "dynamic_sampling/kept_groups": 2.0},
    ]  # fmt: skip
    write_curves(history, tmp_path / "c.png", panels=PANELS["rlvr"])
    drawn = [(ax.get_title(), label, style) for ax, label, style in drawn]
    labels = [label for _, label, _ in drawn]
    assert not any("env/success_rate" in x for x in labels)  # the kept groups' success
    accuracy = [label for title, label, _ in drawn if title == "accuracy"]
    assert any("[reward/accuracy]" in x and "before dynamic sampling" in x for x in accuracy)
    assert any("[val/greedy/accuracy]" in x for x in accuracy)


def test_distill_curves_have_a_reverse_kl_panel(tmp_path, monkeypatch):
    from rl_runtime.track.curves import PANELS

    drawn = _plotted(monkeypatch)
    history = [
        {"step": 1, "reward/accuracy": 0.2, "distill/reverse_kl": 1.5},
        {"step": 2, "reward/accuracy": 0.3, "distill/reverse_kl": 0.9, "distill/forward_kl": 0.8,
         "val/greedy/accuracy": 0.4},
    ]  # fmt: skip
    write_curves(history, tmp_path / "c.png", panels=PANELS["distill"])
    kl = [label for ax, label, _ in drawn if ax.get_title().startswith("student to teacher")]
    assert any("[distill/reverse_kl]" in x and "reverse KL" in x for x in kl)
    assert any("[distill/forward_kl]" in x for x in kl)
    accuracy = [label for ax, label, _ in drawn if ax.get_title() == "student's accuracy"]
    assert any("[val/greedy/accuracy]" in x for x in accuracy)


def test_agentic_training_and_validation_curves_are_drawn_distinctly(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    drawn = _plotted(monkeypatch)
    saved = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: saved.append(fig))
    history = [{"step": s, "env/success_rate": 0.5, "val/success_rate": 0.5} for s in (1, 2)]
    write_curves(history, tmp_path / "c.png")
    drawn = [(ax.get_title(), label, style) for ax, label, style in drawn]
    styles = {label: style for title, label, style in drawn if title == "success"}
    train = next(s for label, s in styles.items() if "[env/success_rate]" in label)
    val = next(s for label, s in styles.items() if "[val/success_rate]" in label)
    assert train == "-" and val == "--"  # equal values: still two visible curves
    for ax in (ax for ax in saved[0].axes if ax.lines):
        assert ax.get_xlabel() == "step" and ax.get_ylabel() and ax.get_legend() is not None
