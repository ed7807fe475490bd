"""What a run starts from, decided and said before its workers start: the checkpoint manager,
the checkpoint it resumes (its config checked against this one, rl_runtime.run.resume_guard), its
metrics rewound to that step, and the warnings printed first; once the workers have started, an
earlier run's results are set aside and the resolved config is written.

A resumed run says so first and goes on in its run's metrics.jsonl, cut back to the checkpoint's
step first (tracking.rewind_metrics: each step once; TensorBoard hides the later points too), so
its curves.png plots the whole run; rl_runtime.run.resume_guard compares the checkpoint's config,
app section and derived values for the pipeline kind run (`RunOptions.pipeline`). A fresh run,
once its workers have started (a run that fails to start moves and rewrites nothing), moves an
earlier run's metrics, checkpoints and outputs (summary.json, curves.png, resolved_config.yaml,
hf_model/, and the app's `RunOptions.app_outputs`) in its directories aside
(rl_runtime.run.previous_run) and says where. A run with `resume_from_checkpoint: true` whose
checkpoint directory holds no checkpoint starts fresh, and its first line says so
(`nothing_to_resume`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_runtime.compose import Components
from rl_runtime.run.checks import check_in_process, check_optional_packages
from rl_runtime.run.options import RunOptions
from rl_runtime.run.previous_run import earlier_run_outputs, set_aside_previous_run
from rl_runtime.run.resume_guard import check_resume, check_resume_step
from rl_runtime.state.checkpoint import RunCheckpoints, RunState
from rl_runtime.track.tracking import earlier_run_logs, rewind_metrics, tracker_log_dir


@dataclass
class Start:
    """What `announce` found: the checkpoint manager (None: no training role), the checkpoint
    resumed and its run state (None: a fresh run), and the resumed run's metric rows up to its
    checkpoint (its curves show the whole run)."""

    ckpt: RunCheckpoints | None = None
    resume: Path | None = None
    state: RunState | None = None
    resumed_rows: list[dict[str, float]] = field(default_factory=list)


def announce(cfg: Any, components: Components, options: RunOptions, pipeline: str | None) -> Start:
    """First output: the resume line, or the line saying a resume found no checkpoint, then
    warnings (an earlier run's results are set aside, and the resolved config written, once the
    workers have started: `set_aside_and_record`). Refused here, before anything starts:
    training roles of several ranks without Ray (`check_in_process`), and a resume whose config
    changed a key the checkpoint depends on (rl_runtime.run.resume_guard)."""
    c = components
    if c.checkpoint.key_file:  # sandboxed calls see it empty (workers: RL_SANDBOX_HIDE)
        from rl_envs.sandbox.credentials import hide_from_calls

        hide_from_calls(c.checkpoint.key_file)
    in_process_warnings = check_in_process(c, options.use_ray)
    ckpt, resume, state = None, None, None
    resumed_rows: list[dict[str, float]] = []
    resume_warnings: list[str] = []
    if c.role("actor_train") is not None:
        ckpt = RunCheckpoints(
            c.checkpoint.directory,
            keep_last=c.checkpoint.keep_last,
            key_file=c.checkpoint.key_file,
        )
        ckpt.cleanup()
        resume = ckpt.resolve(c.checkpoint.resume)
        if resume is not None:
            state = ckpt.load_state(resume)
            print(
                f"resuming from checkpoint {resume} at step {state.step} "
                f"(weight version {state.weight_version})",
                flush=True,
            )
            log_dir = tracker_log_dir(c.tracker.log_dir, c.tracker.kwargs)
            resumed_rows, rewound = rewind_metrics(log_dir, state.step)
            if rewound is not None:
                print(rewound, flush=True)
            resume_warnings = check_resume(
                state.extra.get("config"), cfg, str(resume),
                saved_app=state.extra.get("app"), app=options.app_record,
                pipeline=pipeline, saved_derived=state.extra.get("derived"),
                derived=options.derived,
            )  # fmt: skip
            finished = check_resume_step(state.step, c.cadence.max_steps, resume)
            if finished:
                print(finished, flush=True)
    asked = c.checkpoint.resume not in (None, False, "", "false", "False")
    if resume is None and ckpt is not None and asked:
        print(nothing_to_resume(c.checkpoint.directory), flush=True)
    for line in (
        *resume_warnings,
        *cfg.config_warnings(),
        *c.warnings,
        *in_process_warnings,
        *check_optional_packages(cfg),
    ):
        print(f"warning: {line}", flush=True)
    return Start(ckpt, resume, state, resumed_rows)


def set_aside_and_record(
    cfg: Any,
    components: Components,
    options: RunOptions,
    ckpt: RunCheckpoints | None,
    fresh: bool,
) -> None:
    """Once the workers have started (nothing is moved by a run that did not start): a fresh
    run moves an earlier run's results in its directories aside (and says where); then the
    resolved config is written."""
    c = components
    if fresh:
        earlier = earlier_run_logs(tracker_log_dir(c.tracker.log_dir, c.tracker.kwargs))
        moved = set_aside_previous_run(
            earlier
            + (ckpt.present() if ckpt is not None else [])
            + earlier_run_outputs(c.output_dir, options.app_outputs)
        )
        if moved is not None:
            print(moved, flush=True)
    from rl_config.redact import dump_resolved

    dump_resolved(cfg, c.output_dir)


def nothing_to_resume(directory: str | Path) -> str:
    """The line a run with `resume_from_checkpoint: true` prints first when `directory` holds
    no checkpoint: it starts fresh (so that one command both starts a run and continues it after
    an interruption), and says so, naming earlier runs' checkpoints set aside there."""
    from rl_runtime.run.previous_run import PREFIX

    root = Path(directory)
    aside = sorted(p for p in root.glob(f"{PREFIX}*/step-*") if p.is_dir()) if root.is_dir() else []
    where = (
        f"; earlier checkpoints set aside there: {', '.join(map(str, aside[-3:]))} (to resume "
        "one of those, set resume_from_checkpoint to its path)"
        if aside
        else ""
    )
    return (
        f"resume_from_checkpoint is set, but {root} holds no checkpoint: this run STARTS FRESH "
        f"from step 0{where}"
    )


def saved_reference(checkpoint: Path) -> Path:
    """The warm-up's policy a checkpoint holds for the reference role; a clear error when the
    checkpoint's run had no reference (no KL term) and this one has."""
    from rl_config.errors import ConfigError, ConfigIssue

    saved = checkpoint / "reference"
    if not saved.is_dir():
        raise ConfigError(
            ConfigIssue(
                "resume_from_checkpoint",
                f"{checkpoint} was written by a run that started RL from its supervised warm-up "
                "and had no KL term, so it holds no copy of that policy; with a KL term "
                "(use_kl_loss, add_token_level_kl) the resumed run's reference would be the "
                "untrained pretrain model. Resume without the KL term, or start a new run.",
            )
        )
    return saved
