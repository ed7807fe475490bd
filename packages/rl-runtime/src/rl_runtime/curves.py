"""PNG curves of a run (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path


def write_curves(
    history: Sequence[Mapping[str, float]],
    path: str | os.PathLike[str],
    *,
    panels: Mapping[str, Sequence[str]] | None = None,
    title: str = "",
    baselines: Mapping[str, float] | None = None,
) -> Path:
    """Plot metric rows (`{"step": n, name: value}`) into one PNG with a panel per group.

    `panels`: panel title -> metric names (default: reward and success, train and val).
    Metrics missing from every row are skipped. Evaluation metrics (`val/*`) are drawn with a
    marker at every evaluation point, per-step metrics as plain lines. `baselines`:
    `"label: metric" -> value`, a dashed horizontal line in each panel that shows `metric`.
    Returns the PNG path.
    """
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("PNG curves need matplotlib: install rl-runtime[plot]") from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    panels = dict(
        panels
        or {
            "reward": ["env/episode_reward", "val/episode_reward"],
            "success": ["env/success_rate", "val/success_rate", "val/greedy/success_rate"],
        }
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (panel, names) in zip(axes[0], panels.items()):
        for name in names:
            points = [(r["step"], r[name]) for r in history if name in r]
            if points:
                xs, ys = zip(*points)
                evaluated = name.startswith("val/")
                ax.plot(xs, ys, marker="o" if evaluated else None, markersize=5, label=name)
        for label, value in (baselines or {}).items():
            if label.rsplit(": ", 1)[-1] in names:
                ax.axhline(value, linestyle="--", linewidth=1, color="gray", alpha=0.8)
                ax.annotate(label, (0, value), xycoords=("axes fraction", "data"), fontsize=7)
        ax.set_title(panel)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
