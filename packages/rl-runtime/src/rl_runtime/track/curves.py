"""PNG curves of a run (matplotlib, Agg backend: no display needed).

Each pipeline plots its own headline metrics (`PANELS`, by pipeline kind): RLVR the training
batch's reward and accuracy over every generated group (before dynamic sampling drops any) and
held-out accuracy; agentic training and validation success, drawn so that neither hides the
other (training: a solid line; evaluations: dashed, with markers); DPO preference accuracy and
reward margins, training and held-out; distillation (apps/distill) the student's accuracy and its
reverse (and, distilling on the teacher's logits, forward) KL to the teacher per token. Every panel has axis labels and a legend naming what
each line is (`LABELS`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Panel:
    """One plot of the PNG: its title, its y axis label and the metrics drawn in it."""

    title: str
    ylabel: str
    metrics: tuple[str, ...]


DEFAULT_PANELS = (
    Panel("reward", "episode reward", ("env/episode_reward", "val/episode_reward")),
    Panel("success", "success rate",
          ("env/success_rate", "val/success_rate", "val/greedy/success_rate")),
)  # fmt: skip

PANELS: dict[str, tuple[Panel, ...]] = {
    "agentic": DEFAULT_PANELS,
    "rlvr": (
        Panel("accuracy", "accuracy",
              ("reward/accuracy", "val/greedy/accuracy", "val/accuracy", "val/pass@k",
               "val/baseline_accuracy")),
        Panel("training batch reward (every generated group)", "mean reward", ("reward/mean",)),
        Panel("dynamic sampling", "groups per step",
              ("dynamic_sampling/generated_groups", "dynamic_sampling/kept_groups")),
    ),
    "distill": (
        Panel("student's accuracy", "accuracy",
              ("reward/accuracy", "val/greedy/accuracy", "val/accuracy", "val/pass@k",
               "val/baseline_accuracy")),
        Panel("student to teacher, per trained token", "nats per token",
              ("distill/reverse_kl", "distill/forward_kl")),
    ),
    "dpo": (
        Panel("preference accuracy", "chosen scored above rejected",
              ("train/rewards/accuracies", "val/rewards/accuracies")),
        Panel("reward margin", "chosen - rejected (implicit reward)",
              ("train/rewards/margins", "val/rewards/margins")),
    ),
}  # fmt: skip
"""The panels each pipeline kind plots (rl_runtime.run.runner.Runner picks by its kind)."""

LABELS = {
    "env/episode_reward": "training episodes (sampled)",
    "val/episode_reward": "validation (sampled)",
    "env/success_rate": "training episodes (sampled)",
    "val/success_rate": "validation (sampled)",
    "val/greedy/success_rate": "validation (greedy)",
    "reward/accuracy": "training batch, before dynamic sampling",
    "reward/mean": "training batch, before dynamic sampling",
    "val/greedy/accuracy": "held-out, greedy",
    "val/accuracy": "held-out, sampled (mean over samples)",
    "val/pass@k": "held-out, sampled pass@k",
    "val/baseline_accuracy": "held-out, most common training answer",
    "dynamic_sampling/generated_groups": "generated",
    "dynamic_sampling/kept_groups": "kept (trained on)",
    "distill/reverse_kl": "reverse KL(student || teacher)",
    "distill/forward_kl": "forward KL(teacher || student) (token-level distillation)",
    "train/rewards/accuracies": "training batches",
    "val/rewards/accuracies": "held-out pairs",
    "train/rewards/margins": "training batches",
    "val/rewards/margins": "held-out pairs",
}
"""Legend text of a metric (its name where it has none here), followed by the name itself."""


def _panels(panels: Mapping[str, Sequence[str]] | Sequence[Panel] | None) -> list[Panel]:
    if panels is None:
        return list(DEFAULT_PANELS)
    if isinstance(panels, Mapping):
        return [Panel(title, "", tuple(names)) for title, names in panels.items()]
    return list(panels)


def _evaluated(name: str) -> bool:
    return name.startswith("val/")


def write_curves(
    history: Sequence[Mapping[str, float]],
    path: str | os.PathLike[str],
    *,
    panels: Mapping[str, Sequence[str]] | Sequence[Panel] | None = None,
    title: str = "",
    baselines: Mapping[str, float] | None = None,
) -> Path:
    """Plot metric rows (`{"step": n, name: value}`) into one PNG with a panel per group.

    `panels`: `Panel`s, or panel title -> metric names (default: `DEFAULT_PANELS`). Metrics
    missing from every row are skipped. Per-step metrics are solid lines drawn above the rest;
    evaluation metrics (`val/*`) dashed, with a hollow marker at every evaluation point (so a
    per-step curve that runs into them stays visible; greedy ones larger squares). `baselines`: `"label: metric" ->
    value`, a dashed horizontal line in each panel that shows `metric`. Returns the PNG path.
    """
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("PNG curves need matplotlib: install rl-runtime[plot]") from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    shown = _panels(panels)
    fig, axes = plt.subplots(1, len(shown), figsize=(5.5 * len(shown), 4.0), squeeze=False)
    for ax, panel in zip(axes[0], shown):
        for name in panel.metrics:
            points = [(r["step"], r[name]) for r in history if name in r]
            if not points:
                continue
            xs, ys = zip(*points)
            label = f"{LABELS.get(name, name)} [{name}]" if name in LABELS else name
            if _evaluated(name):  # greedy: squares, so equal sampled points stay visible
                greedy = "/greedy/" in name
                ax.plot(xs, ys, linestyle="--", linewidth=1.5, marker="s" if greedy else "o",
                        markersize=9 if greedy else 6, markerfacecolor="none", label=label,
                        zorder=2)  # fmt: skip
            else:
                ax.plot(xs, ys, linewidth=2, marker="." if len(xs) < 40 else None,
                        label=label, zorder=3)  # fmt: skip
        for label, value in (baselines or {}).items():
            if label.rsplit(": ", 1)[-1] in panel.metrics:
                ax.axhline(value, linestyle="--", linewidth=1, color="gray", alpha=0.8)
                ax.annotate(label, (0, value), xycoords=("axes fraction", "data"), fontsize=7)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
