"""The per-step progress line without a terminal, and curves with baseline lines."""

from __future__ import annotations

import io

from rl_runtime.curves import write_curves
from rl_runtime.timing import StepProgress


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

    from rl_runtime.timing import summary_table

    rows = {"baseline": {"sampled": 0.2}, "after": {"sampled": 0.5, "greedy": 0.7}}
    console = Console(width=120, record=True)
    console.print(summary_table("t", rows))
    text = console.export_text()
    assert "greedy" in text and "0.700" in text and "0.200" in text
