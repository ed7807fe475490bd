"""What a run reports at its end: where its results went (`run_outputs`), the evaluation table
and result line (`print_result`), and the error of a run that trained on nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_runtime.compose import RunComponents
from rl_runtime.run.options import RunResult
from rl_runtime.run.previous_run import SUMMARY_NAME
from rl_runtime.track.tracking import tracker_log_dir


class NothingTrainedError(RuntimeError):
    """Every step of the run trained on nothing (rl_runtime.step.metrics.skip_reason): the policy is
    the one it started from, and the run ends with this error instead of a results table."""

    @classmethod
    def after(cls, steps: int, summary: Path) -> NothingTrainedError:
        """The error of a run whose `steps` steps were all skipped, `summary` its summary.json."""
        return cls(
            f"every one of the run's {steps} steps was skipped: it trained on nothing "
            "(dynamic sampling kept no group: each group's rewards were all equal, or every "
            "sample was too stale), so the policy is the one it started from. Look at "
            f"reward/mean and reward/accuracy in {summary} and the logs; give "
            "dynamic sampling more rounds (dynamic_sampling.max_num_gen_batches), more "
            "prompts per step (rollout_batch_size) or samples per prompt "
            "(num_return_sequences_in_group), or turn it off (dynamic_sampling.enable=false)"
        )


def run_outputs(
    components: RunComponents, curves: str | None, hf_model: str | None
) -> dict[str, str]:
    """Where a run's results are, by kind (the last line of a run, summary.json's `outputs`):
    checkpoints, logs (metrics.jsonl), tensorboard (when tracked), curves, summary, hf_model.
    A pipeline or command that writes more adds its entry here."""
    c = components
    logs = tracker_log_dir(c.tracker.log_dir, c.tracker.kwargs)
    tracked = str(c.tracker.track_with)
    out = {
        "checkpoints": c.checkpoint.directory if c.role("actor_train") is not None else "none",
        "logs": str(logs),
        "tensorboard": str(logs) if "tensorboard" in tracked else "not tracked",
        "curves": curves or "none",
        "summary": str(Path(c.output_dir) / SUMMARY_NAME),
        "hf_model": hf_model or "not exported (export_hf: false)",
    }
    return out


def print_result(
    result: RunResult,
    title: str,
    row: Any,
    before_label: str = "before RL",
    after_label: str = "after RL",
) -> None:
    """The evaluation table (`row(metrics) -> columns`: baselines, before and after training),
    the recipe's summary figures and the run's result line."""
    from rich.console import Console

    from rl_runtime.track.timing import summary_table

    rows = {name: row(m) for name, m in result.baselines.items()}
    rows.update({before_label: row(result.eval_before), after_label: row(result.eval_after)})
    rows = {k: v for k, v in rows.items() if v}
    console = Console()
    if not console.is_terminal:  # a log file: rich's 80 columns would cut the table
        console = Console(width=160)
    if rows:
        console.print(summary_table(title, rows))
    for key, value in result.summary.items():
        console.print(f"{key}: {value}")
    if result.skipped_steps:
        console.print(
            f"skipped steps: {result.skipped_steps} of {result.step} trained on nothing "
            "(dynamic sampling kept no group, or every sample was too stale)"
        )
    console.print(
        f"steps={result.step} weight_version={result.weight_version} "
        f"wall={result.wall_seconds:.0f}s curves={result.curves} hf_model={result.hf_model}"
    )
    if result.outputs:  # the last line: where everything went
        line = "outputs: " + " ".join(f"{k}={v}" for k, v in result.outputs.items())
        console.print(line, soft_wrap=True, markup=False, highlight=False)


def interrupted_summary(
    exc: Any, resume: Path | None, eval_before: dict[str, float], skipped_steps: int
) -> dict[str, Any]:
    """summary.json of an interrupted run (`exc`: rl_runtime.run.interrupts.RunInterrupted): the
    signal, the step reached, the last durable checkpoint and the command that resumes from it
    (the runner adds its throughput totals)."""
    return {
        "interrupted": exc.name,
        "step": exc.step,
        "last_checkpoint": exc.checkpoint,
        "resume_command": exc.resume_command,
        "resumed_from": str(resume) if resume is not None else None,
        "eval_before": eval_before,
        "skipped_steps": skipped_steps,
    }
