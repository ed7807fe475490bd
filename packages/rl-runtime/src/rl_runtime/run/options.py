"""An app's runtime-only choices for a run (`RunOptions`), and what a run returns (`RunResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rl_runtime.run.resume_guard import app_record


@dataclass
class RunOptions:
    """Runtime-only choices of an app (never config keys)."""

    model_path: str
    use_ray: bool = True
    num_cpus: float | None = None
    object_store_mb: int = 200
    cpu_per_bundle: float = 1.0
    agent_mode: str = "lockstep"
    eval_before_training: bool = True
    export_hf: bool = False
    stdout_keys: tuple[str, ...] = ()
    #: metrics shown per step by the progress bar (or, without a terminal, the per-step line)
    progress_keys: tuple[str, ...] = (
        "env/success_rate",
        "env/episode_reward",
        "val/success_rate",
        "val/greedy/success_rate",
    )
    #: the app's own section as a checkpoint records it (rl_runtime.run.resume_guard.app_record)
    app_record: dict[str, Any] = field(default_factory=dict)
    #: the pipeline kind the app runs (agentic, rlvr, dpo: the app options' `PIPELINE`); a
    #: resume refuses the changed keys that kind reads (None: the config's `pipeline_kind`)
    pipeline: str | None = None
    #: the `rl_runtime.track.curves.PANELS` key of the run's curves (None: `pipeline`'s)
    curve_panels: str | None = None
    #: values the app derives from several config keys and reads for its data (apps/rlvr: the
    #: prompt budget); a checkpoint records them and a resume refuses a change (resume_guard)
    derived: dict[str, Any] = field(default_factory=dict)
    #: files or directories the app itself writes for this run outside the runner's
    #: (apps/async: its summary.json of both runs); a fresh run moves an earlier one aside too
    app_outputs: tuple[str, ...] = ()

    #: the attributes :meth:`from_app` reads from an app's options
    APP_FIELDS = (
        "use_ray",
        "num_cpus",
        "object_store_mb",
        "cpu_per_bundle",
        "eval_before_training",
        "export_hf",
    )

    @classmethod
    def from_app(cls, app: Any, model_path: str, **overrides: Any) -> RunOptions:
        """The run options an app's options object carries (:attr:`APP_FIELDS`, and the whole
        section as `app_record`), with ``overrides`` (the app's own keys, or changes to those)
        on top."""
        fields = {name: getattr(app, name) for name in cls.APP_FIELDS}
        fields["app_record"] = app_record(app)
        fields["pipeline"] = getattr(app, "PIPELINE", None)
        return cls(model_path=model_path, **{**fields, **overrides})


@dataclass
class RunResult:
    step: int
    weight_version: int
    wall_seconds: float
    eval_before: dict[str, float]
    eval_after: dict[str, float]
    resumed_from: str | None
    curves: str | None = None
    hf_model: str | None = None
    baselines: dict[str, dict[str, float]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    #: the whole run's (`"scope": "run"`, a resumed run's checkpointed part included):
    #: samples_trained, loop_seconds, samples_per_s; `wall_seconds` is this invocation's
    throughput: dict[str, Any] = field(default_factory=dict)
    #: the whole run's steps that trained on nothing (a resumed run's checkpointed part included)
    skipped_steps: int = 0
    #: where the run's results went (`run_outputs`): the final line lists them
    outputs: dict[str, str] = field(default_factory=dict)
