"""The run skeleton shared by apps: `Runner(cfg, components, recipe, options).run()`.

The runner owns what every pipeline needs (seeding, the cluster, tracker, weight sync, checkpoint
manager and resume; the cadence of logging/eval/save, progress, summary; teardown in `finally`).
A recipe supplies its science through a small protocol (composition, not inheritance):

    step(ctx) -> metrics             one pipeline step (the runner counts steps)
    evaluate(ctx) -> metrics         validation ({} when there is none)
    setup(ctx)                       optional: recipe state that needs the cluster (tokenizer ...)
    before_training(ctx) -> metrics  optional: e.g. a supervised warm-up (not on resume)
    baselines(ctx) -> {name: metrics} optional: reference policies scored like `evaluate` (rows
                                     of the final table, lines in curves.png, summary.json)
    summary(before, after) -> dict   optional: figures derived from the evaluations (summary.json)
    state() / load_state(d)          optional: recipe-only state saved in checkpoints
    rollout(ctx, index) -> RolloutBatch  asynchronous training (components.asynchronous): the
    learn(ctx, batch) -> metrics     step split into generation (on the producer thread: only
                                     actor_infer calls) and training + weight sync
    rollout_state() / load_rollout_state(d)  optional: the rollout side's state (a prompt sampler)
                                     as it was before a batch (rl_runtime.asynchrony.training)

`ctx` exposes the cluster, the components, the step, the weight version (`ctx.sync_weights()`
bumps it), the phase timer, `log`, and sharded `forward`/`train` calls on a role. A pipeline without
rollout engines (no `actor_infer` role, e.g. offline preference training) has no weight sync. The last step always logs, evaluates and saves.
At start the runner prints the config warnings and writes the resolved config (secrets redacted)
to output_dir; at the end it writes output_dir/summary.json (standard JSON: rl_runtime.track.summary_json).
One run at a time per output_dir, and per checkpoint directory where that lies outside it: the run
holds their locks (rl_runtime.run.run_lock) for its life, and a second run on either fails at once
naming the directory and the first run's pid.
A checkpoint records the config,
the app's own section (`RunOptions.app_record`) and the values it derives for its data
(`RunOptions.derived`), which rl_runtime.run.resume_guard compares on resume for the pipeline kind run
(`RunOptions.pipeline`),
and the evaluation before training, which a resumed run's summary keeps. A resumed run says so
first and goes on in its run's metrics.jsonl, cut back to the checkpoint's step first
(tracking.rewind_metrics: each step once; TensorBoard hides the later points too), so its
curves.png plots the whole run; a fresh run, once its workers have started (a run that fails to
start moves and rewrites nothing), moves an earlier run's metrics, checkpoints and outputs
(summary.json, curves.png, resolved_config.yaml, hf_model/, and the app's
`RunOptions.app_outputs`) in its directories aside (rl_runtime.run.previous_run) and says where. A
run with `resume_from_checkpoint: true` whose checkpoint directory holds no checkpoint starts
fresh, and its first line says so (`nothing_to_resume`).
Throughput: `throughput/samples_per_s` (trained samples, `rollout/num_trajectories`, per second of
the training loop without evaluation and checkpoints), in the metrics and summary.json
(`throughput`: `samples_trained`, `loop_seconds`, `samples_per_s`). They are the whole run's,
`"scope": "run"`: a checkpoint carries the totals so far and a resumed run goes on from them (its
rate includes the training loop's seconds before the interruption; the steps after the last
checkpoint that were lost are counted once, as trained again). `wall_seconds` is this
invocation's.
With `components.asynchronous`, rollout runs ahead of the trainer (rl_runtime.asynchrony.training).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rl_runtime.cli.export import MODEL_PATH_KEY
from rl_runtime.compose import Components, RunComponents, role_specs
from rl_runtime.run.interrupts import RunInterrupted, handle_interrupts, resume_command, stopping
from rl_runtime.run.previous_run import (
    CURVES_NAME,
    HF_MODEL_NAME,
    SUMMARY_NAME,
    earlier_run_outputs,
    set_aside_previous_run,
)
from rl_runtime.run.recipe import Recipe
from rl_runtime.run.resume_guard import app_record, check_resume, check_resume_step, config_record
from rl_runtime.run.run_lock import run_directories_lock
from rl_runtime.state.checkpoint import CheckpointManager, RunState, capture_rng, restore_rng
from rl_runtime.state.seeds import seed_globals
from rl_runtime.step.metrics import TRAINED_SAMPLES_KEY, skip_reason
from rl_runtime.track.summary_json import write_summary
from rl_runtime.track.timing import PhaseTimer, StepProgress, long_phase
from rl_runtime.track.tracking import Tracker, earlier_run_logs, rewind_metrics, tracker_log_dir

THROUGHPUT_KEY = "throughput"
"""The checkpoint's extra state holding the run's throughput totals (`Runner.throughput_state`)."""
WARMED_UP_KEY = "started_from_warm_up"
"""Checkpoint state: RL started from a supervised warm-up's policy, not `pretrain`; a reference
role held that policy, and its weights are in the checkpoint's `reference/`."""
SKIPPED_STEPS_KEY = "skipped_steps"
"""Checkpoint state: the run's steps so far that trained on nothing (rl_runtime.step.metrics.skip_reason)."""


class NothingTrainedError(RuntimeError):
    """Every step of the run trained on nothing (rl_runtime.step.metrics.skip_reason): the policy is
    the one it started from, and the run ends with this error instead of a results table."""


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
class Context:
    """What a recipe sees: cluster, components, step counters, timer, logging."""

    components: Components
    options: RunOptions
    cluster: Any
    tracker: Tracker
    sync: Any = None
    step: int = 0
    weight_version: int = 0
    timer: PhaseTimer = field(default_factory=PhaseTimer)
    #: a context every weight sync runs in (asynchronous training without partial rollout:
    #: the rollout producer's `between_batches`)
    sync_gate: Callable[[], AbstractContextManager[Any]] | None = None
    #: a weight sync returns once sent; the engines' versions are checked at the next sync,
    #: evaluation, checkpoint or the end of the loop (`settle_weights`; asynchronous training
    #: with partial rollout, where generation never waits for a sync: WeightSync.sync)
    defer_sync: bool = False
    #: a weight sync is staged (`WeightSync.stage`: the trainer snapshots its weights into shared
    #: memory) and posted to this rollout producer, which delivers it between two batches
    #: (`RolloutProducer.post_weights`; asynchronous training without partial rollout, where a
    #: weight update must not reach a generation half-way): the trainer never waits for the
    #: batch in flight, only, at its next sync, for a delivery running then (the staging buffers
    #: alternate; a staged version still waiting is superseded, `sync/superseded`)
    sync_producer: Any = None
    #: RL starts from a supervised warm-up's policy, not `pretrain`
    #: (`adopt_policy_as_reference`); checkpoints then carry the reference role's weights
    warmed_up: bool = False

    def check_warm_up_allowed(self) -> None:
        """A supervised warm-up cannot run when the reference is actor_train's base model (its
        LoRA adapter disabled, `Components.reference_from_actor`): the KL terms would measure
        the distance from the pretrained model, not from the warmed-up policy RL starts from."""
        if self.components.reference_from_actor:
            raise ValueError(
                "a supervised warm-up before RL moves the policy away from the reference, which "
                "is actor_train's base model (its LoRA adapter disabled): give the reference "
                "its own model (reference.model_args.model_name_or_path) or drop the warm-up"
            )

    def adopt_policy_as_reference(self) -> None:
        """After a supervised warm-up: the reference role takes actor_train's current weights,
        so that KL terms measure the distance from the policy RL starts from (the warmed-up one),
        not from the `pretrain` model the warm-up moved away from."""
        self.check_warm_up_allowed()
        self.warmed_up = True
        if self.cluster.has("reference"):
            weights = self.cluster["actor_train"].call_all("named_tensors")[0]
            self.cluster["reference"].call_all("adopt_weights", weights)

    def sync_weights(self, *, new_version: bool = True) -> dict[str, float]:
        """Hand the devices to rollout and push the trainer's weights to the engines, as the next
        weight version (or again as the current one, after a restore). Colocated, the engines wake
        first and the weights cross while the trainer still holds them on the device; then the
        trainer offloads (`Cluster.enter_phase(..., handoff=...)`)."""
        if new_version:
            self.weight_version += 1
        with self.sync_gate() if self.sync_gate is not None else nullcontext():
            return self.cluster.enter_phase("rollout", handoff=self._push_weights)

    def _push_weights(self) -> dict[str, float]:
        if self.sync_producer is None:
            return self.sync.sync(self.weight_version, settle=not self.defer_sync)
        t0 = time.perf_counter()
        self.sync_producer.wait_for_delivery()  # its buffer may be the one this stage reuses
        waited = time.perf_counter() - t0
        deliver, metrics = self.sync.stage(self.weight_version)
        superseded = self.sync_producer.post_weights(deliver)
        return {**metrics, "sync/delivery_wait_s": waited, "sync/superseded": float(superseded)}

    def settle_weights(self) -> None:
        """Until every engine holds the last synced version (a deferred sync confirmed, a
        posted one delivered)."""
        if self.sync_producer is not None:
            self.sync_producer.deliver_posted()
        if self.sync is not None:
            self.sync.settle()

    def has_reference(self) -> bool:
        """Whether the run has reference log-probs: a reference role, or actor_train's LoRA
        with its adapter disabled (`Components.reference_from_actor`)."""
        return self.cluster.has("reference") or self.components.reference_from_actor

    def forward(self, role: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`forward` on every rank of `role`, rows sharded over the ranks and merged back.
        `reference` without a reference role (`Components.reference_from_actor`) is
        actor_train's `forward_base`: its base model, the LoRA adapter disabled."""
        from rl_runtime.step.collate import merge_rows, shard_rows

        method = "forward"
        if role == "reference" and self.components.reference_from_actor:
            role, method = "actor_train", "forward_base"
        group = self.cluster[role]
        shards = shard_rows(tensors, len(group.workers))
        outs = group.wait(group.submit_each(method, [(s,) for s in shards]), method)
        return merge_rows(outs)

    def train(self, role: str, tensors: dict[str, torch.Tensor], loss: str = "default") -> dict:
        """One `train_step` of `role` on sharded rows; rank 0's metrics."""
        from rl_runtime.step.collate import shard_rows

        group = self.cluster[role]
        args = [(s, loss) for s in shard_rows(tensors, len(group.workers))]
        return group.wait(group.submit_each("train_step", args), "train_step")[0]

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.tracker.log(metrics, step=self.step if step is None else step)


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


def engine_weight_diff(ctx: Context) -> float:
    """Largest |trainer - engine| over the parameters the engines expose (0.0 after an exact
    sync), once the last sync has settled (`Context.settle_weights`). vLLM on the CPU cannot read
    back oneDNN-packed weights, so only the common names are compared; an engine name the
    trainer lacks is an error."""
    ctx.settle_weights()
    cluster = ctx.cluster
    trainer = cluster["actor_train"].call_rank0("state_dict_for_check")
    diffs = []
    for engine in cluster["actor_infer"].call_all("state_dict_for_check"):
        extra = sorted(set(engine) - set(trainer))
        if extra or not engine:
            raise RuntimeError(f"engine parameters not in the trainer: {extra[:5]}")
        diffs += [float((trainer[k].float() - engine[k].float()).abs().max()) for k in engine]
    return max(diffs) if diffs else 0.0


def machine_kwargs() -> dict[str, Any]:
    """What composing needs to know about this machine: its device kind and whether flash-attn
    imports (`compose(cfg, **machine_kwargs())`)."""
    import importlib.util

    from rl_sync.device import detect_device_kind

    return {
        "device_kind": detect_device_kind(),
        "flash_attn_available": importlib.util.find_spec("flash_attn") is not None,
    }


def compose_here(
    cfg: Any, *, rollout_only: bool = False, pipeline: str | None = None
) -> Components:
    """`compose(cfg)` for this machine (`machine_kwargs`), for the app kind `pipeline`."""
    from rl_runtime.compose import compose

    return compose(cfg, rollout_only=rollout_only, pipeline=pipeline, **machine_kwargs())


def plan_text(components: Components) -> str:
    """What `--dry-run` prints: the device placement of every role, then the components."""
    from rl_runtime.compose import describe

    return placement_plan(components).describe() + "\n" + describe(components)


def placement_plan(components: Components, cpu_per_bundle: float = 1.0) -> Any:
    """The `rl_runtime.cluster.placement.PlacementPlan` the cluster will make on this machine's device
    kind (an impossible placement raises here)."""
    from rl_runtime.cluster.placement import plan_placement
    from rl_sync.device import detect_device_kind, ray_resource_name

    kind = detect_device_kind()
    return plan_placement(
        {r.role: list(r.device_mapping) for r in components.roles},
        num_devices=components.cluster.num_devices,
        device_kind=kind,
        resource_name=ray_resource_name(kind),
        devices_per_worker={r.role: r.devices_per_worker for r in components.roles},
        cpu_per_bundle=cpu_per_bundle,
        devices_per_node=components.cluster.devices_per_node,
        node_resources=components.cluster.node_resources,
    )


def check_embedded_cpus(components: Components, options: Any) -> None:
    """Before Ray starts (a dry run included): a ``ConfigError`` when the placement reserves
    more CPUs than the embedded cluster the run will start (``num_cpus``) holds; skipped when
    joining a cluster (RAY_ADDRESS) or when num_cpus is left to Ray. Devices are checked once
    Ray reports them (rl_runtime.cluster.cluster.embedded_fit_error)."""
    from rl_runtime.cluster.cluster import embedded_fit_error
    from rl_runtime.cluster.ray_setup import RayOptions, joined_address

    if not options.use_ray or options.num_cpus is None or joined_address(RayOptions()):
        return
    plan = placement_plan(components, options.cpu_per_bundle)
    error = embedded_fit_error(plan, {**plan.resource_totals(), "CPU": options.num_cpus})
    if error is not None:
        raise error


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


def check_optional_packages(cfg: Any) -> list[str]:
    """Before anything starts: a ``ConfigError`` naming each optional package the config needs
    that is not installed (key, reason and the install command); returns the descriptions of
    missing packages the run can do without (warnings)."""
    from rl_config.errors import ConfigError, ConfigIssue
    from rl_config.extras import missing_extras

    missing = missing_extras(cfg)
    required = [ConfigIssue(e.key, e.describe()) for e in missing if e.required]
    if required:
        raise ConfigError(required)
    return [e.describe() for e in missing]


def check_in_process(components: RunComponents, use_ray: bool) -> list[str]:
    """Without Ray (`--no-ray`) every worker runs in this process, and a process holds one rank
    of a training role's process group: a ``ConfigError`` naming each training role mapped to
    more than one rank, before anything starts (its first rank would otherwise wait for the
    others until rpc_timeout), and ``async.partial_rollout`` (it needs Ray's concurrent
    calls). Returns warnings for the keys only Ray reads (``node_resources``,
    ``weight_sync_host``, ``weight_sync_transport`` and ``model_update_buffer_size_mb`` off
    their defaults), which such a run ignores."""
    if use_ray:
        return []
    from rl_config.errors import ConfigError, ConfigIssue

    issues = []
    for r in components.roles:
        ranks = len(r.device_mapping) // max(1, r.devices_per_worker)
        if r.trains and ranks > 1:
            issues.append(
                ConfigIssue(
                    f"{r.role}.device_mapping",
                    f"{ranks} ranks, but without Ray (--no-ray) every worker runs in this one "
                    "process, which holds one rank of a training role; run with Ray, or map "
                    f"the role to {r.devices_per_worker} device(s)",
                )
            )
    asynchronous = components.asynchronous
    if asynchronous is not None and asynchronous.partial_rollout:
        issues.append(
            ConfigIssue(
                "async.partial_rollout",
                "needs Ray: without it (--no-ray) a rollout worker runs one call at a time, so "
                "a weight update could never reach a generation in flight",
            )
        )
    if issues:
        raise ConfigError(issues)
    from rl_config.schema import ExperimentConfig

    cluster = components.cluster
    default_mb = ExperimentConfig.model_fields["model_update_buffer_size_mb"].default
    buffer_mb = cluster.sync_bucket_bytes // 1024**2  # 0: no weight sync (DPO)
    ignored = [("node_resources", cluster.node_resources, "there are no Ray nodes to pin to"),
               ("weight_sync_host", cluster.sync_host,
                "the weights reach the engines in this process"),
               ("weight_sync_transport", cluster.sync_transport
                if cluster.sync_transport != "auto" else None,
                "the weights reach the engines in this process"),
               ("model_update_buffer_size_mb", buffer_mb if buffer_mb not in (0, default_mb)
                else None, "the weights reach the engines in this process as whole tensors, "
                "not in transfer buckets")]  # fmt: skip
    return [
        f"{key}={value!r} has no effect without Ray (--no-ray): {why}"
        for key, value, why in ignored
        if value is not None
    ]


def sandbox_hidden_env() -> dict[str, str]:
    """The paths sandboxed calls must see empty (`rl_envs.sandbox.credentials.HIDE_VARIABLE`),
    for the workers' environment: a pool a worker starts hides them too."""
    from rl_envs.sandbox.credentials import HIDE_VARIABLE

    value = os.environ.get(HIDE_VARIABLE)
    return {HIDE_VARIABLE: value} if value else {}


class Runner:
    def __init__(
        self, cfg: Any, components: RunComponents, recipe: Recipe, options: RunOptions
    ) -> None:
        self.cfg = cfg
        self.components = components
        self.recipe = recipe
        self.options = options
        self.ckpt: CheckpointManager | None = None
        self.ctx: Context | None = None
        self.baselines: dict[str, dict[str, float]] = {}
        self.asynchronous: Any = None  # rl_runtime.asynchrony.training.AsyncTraining, while running
        self.samples_trained = 0.0
        self.loop_seconds = 0.0
        #: the run's steps that trained on nothing (rl_runtime.step.metrics.skip_reason)
        self.skipped_steps = 0
        #: the newest checkpoint of this run known to be durable: the last one saved, or the
        #: one it resumed from (None: none yet)
        self.last_checkpoint: str | None = None
        #: the evaluation before training (a resumed run's comes from its checkpoint)
        self.eval_before: dict[str, float] = {}
        #: a resumed run's metric rows up to its checkpoint (its curves show the whole run)
        self.resumed_rows: list[dict[str, float]] = []
        #: the checkpoint step a resumed run goes on from (None: a fresh run)
        self.resumed_step: int | None = None

    # ------------------------------------------------------------------------------ setup
    def pipeline(self) -> str | None:
        """The pipeline kind run: the app's (`RunOptions.pipeline`), else the config's."""
        from rl_config.contract import pipeline_kind

        return self.options.pipeline or pipeline_kind(getattr(self.cfg, "__wrapped__", self.cfg))

    def _announce(self) -> tuple[Path | None, RunState | None]:
        """First output: the resume line, or the line saying a resume found no checkpoint,
        then warnings (an earlier run's results are set aside, and the resolved config written,
        once the workers have started: `_set_aside_and_record`). Refused here, before anything starts: training roles of several ranks
        without Ray (`check_in_process`), and a resume whose config changed a key the
        checkpoint depends on (rl_runtime.run.resume_guard)."""
        c = self.components
        if c.checkpoint.key_file:  # sandboxed calls see it empty (workers: RL_SANDBOX_HIDE)
            from rl_envs.sandbox.credentials import hide_from_calls

            hide_from_calls(c.checkpoint.key_file)
        in_process_warnings = check_in_process(c, self.options.use_ray)
        resume, state = None, None
        resume_warnings: list[str] = []
        if c.role("actor_train") is not None:
            self.ckpt = CheckpointManager(
                c.checkpoint.directory,
                keep_last=c.checkpoint.keep_last,
                key_file=c.checkpoint.key_file,
            )
            self.ckpt.cleanup()
            resume = self.ckpt.resolve(c.checkpoint.resume)
            if resume is not None:
                state = self.ckpt.load_state(resume)
                self.resumed_step = state.step
                print(
                    f"resuming from checkpoint {resume} at step {state.step} "
                    f"(weight version {state.weight_version})",
                    flush=True,
                )
                log_dir = tracker_log_dir(c.tracker.log_dir, c.tracker.kwargs)
                self.resumed_rows, rewound = rewind_metrics(log_dir, state.step)
                if rewound is not None:
                    print(rewound, flush=True)
                resume_warnings = check_resume(
                    state.extra.get("config"), self.cfg, str(resume),
                    saved_app=state.extra.get("app"), app=self.options.app_record,
                    pipeline=self.pipeline(), saved_derived=state.extra.get("derived"),
                    derived=self.options.derived,
                )  # fmt: skip
                finished = check_resume_step(state.step, c.cadence.max_steps, resume)
                if finished:
                    print(finished, flush=True)
        asked = c.checkpoint.resume not in (None, False, "", "false", "False")
        if resume is None and self.ckpt is not None and asked:
            print(nothing_to_resume(c.checkpoint.directory), flush=True)
        for line in (
            *resume_warnings,
            *self.cfg.config_warnings(),
            *c.warnings,
            *in_process_warnings,
            *check_optional_packages(self.cfg),
        ):
            print(f"warning: {line}", flush=True)
        return resume, state

    def _set_aside_and_record(self, fresh: bool) -> None:
        """Once the workers have started (nothing is moved by a run that did not start): a
        fresh run moves an earlier run's results in its directories aside (and says where);
        then the resolved config is written."""
        c = self.components
        if fresh:
            earlier = earlier_run_logs(tracker_log_dir(c.tracker.log_dir, c.tracker.kwargs))
            moved = set_aside_previous_run(
                earlier
                + (self.ckpt.present() if self.ckpt is not None else [])
                + earlier_run_outputs(c.output_dir, self.options.app_outputs)
            )
            if moved is not None:
                print(moved, flush=True)
        from rl_config.redact import dump_resolved

        dump_resolved(self.cfg, c.output_dir)

    def _setup(self) -> Context:
        from rl_runtime.cluster.cluster import Cluster, WeightSync
        from rl_runtime.cluster.ray_setup import RayOptions
        from rl_sync.device import detect_device_kind, ray_resource_name

        c, o = self.components, self.options
        seed_globals(c.seed)
        kind = detect_device_kind()
        specs = self.recipe.roles(c)
        cluster = Cluster.start(
            specs or role_specs(c, o.model_path, o.agent_mode),
            num_devices=c.cluster.num_devices,
            device_kind=kind,
            resource_name=ray_resource_name(kind),
            use_ray=o.use_ray,
            ray_options=RayOptions(
                num_cpus=o.num_cpus,
                object_store_bytes=o.object_store_mb * 1024**2 if kind == "cpu" else None,
                env_vars={**c.cluster.system_envs, **sandbox_hidden_env()},
            ),
            rpc_timeout=c.cluster.rpc_timeout,
            cpu_per_bundle=o.cpu_per_bundle,
            devices_per_node=c.cluster.devices_per_node,
            node_resources=c.cluster.node_resources,
        )
        try:  # started: an earlier run's results may be set aside now (not before)
            self._set_aside_and_record(fresh=self.resumed_step is None)
        except BaseException:
            cluster.shutdown()
            raise
        # in-process runs on an accelerator also record device memory per phase (memory/*)
        timer = PhaseTimer(None if o.use_ray else kind)
        self.ctx = Context(c, o, cluster, tracker=None, timer=timer)  # type: ignore[arg-type]
        self.ctx.tracker = Tracker(
            c.tracker.track_with,
            c.tracker.log_dir,
            c.tracker.kwargs,
            stdout_keys=o.stdout_keys,
            resumed_at=self.resumed_step,
        )
        self.ctx.tracker.history.extend(self.resumed_rows)
        if cluster.has("actor_train") and cluster.has("actor_infer"):
            self.ctx.sync = WeightSync(
                cluster["actor_train"],
                cluster["actor_infer"],
                mode="broadcast" if o.use_ray else "direct",
                timeout_s=c.cluster.rpc_timeout,
                bucket_bytes=c.cluster.sync_bucket_bytes,
                host=c.cluster.sync_host,
                transport=c.cluster.sync_transport,
            )
        self.recipe.setup(self.ctx)
        return self.ctx

    # ------------------------------------------------------------------------ checkpoints
    def _optimizer_roles(self) -> list[str]:
        return [r.role for r in self.components.roles if r.loss is not None]

    def save(self) -> Path:
        ctx = self.ctx
        assert ctx is not None and self.ckpt is not None

        def write(d: Path) -> None:
            for role in self._optimizer_roles():
                ctx.cluster[role].call_all(
                    "save_checkpoint", str(d / role), ctx.step, key_file=self.ckpt.key_file
                )
            if ctx.warmed_up and ctx.cluster.has("reference"):  # not `pretrain` (see restore)
                ctx.cluster["reference"].call_all("export_hf", str(d / "reference"))

        recipe_state = self.recipe.state()
        extra: dict[str, Any] = {
            "recipe": recipe_state,
            "config": config_record(self.cfg),
            "app": self.options.app_record,
            "derived": self.options.derived,
            "eval_before": self.eval_before,
            THROUGHPUT_KEY: self.throughput_state(),
            WARMED_UP_KEY: ctx.warmed_up,
            SKIPPED_STEPS_KEY: self.skipped_steps,
            MODEL_PATH_KEY: self.options.model_path,  # what rl-export builds the model from
        }
        if self.asynchronous is not None:
            from rl_runtime.asynchrony.training import STATE_KEY

            extra[STATE_KEY] = self.asynchronous.state(ctx.step, ctx.weight_version)
        state = RunState(
            step=ctx.step,
            weight_version=ctx.weight_version,
            env_seed_epoch=ctx.step,
            rng=capture_rng(),
            extra=extra,
        )
        saved = self.ckpt.save(state, write)
        self.last_checkpoint = str(saved)
        return saved

    def restore(self, path: Path, state: RunState) -> None:
        ctx = self.ctx
        assert ctx is not None and self.ckpt is not None
        ctx.warmed_up = bool(state.extra.get(WARMED_UP_KEY))
        reference = (
            _saved_reference(path) if ctx.warmed_up and ctx.cluster.has("reference") else None
        )
        for role in self._optimizer_roles():
            ctx.cluster[role].call_all(
                "load_checkpoint", str(path / role), key_file=self.ckpt.key_file
            )
        if reference is not None:  # the warm-up's policy, not `pretrain`
            ctx.cluster["reference"].call_all("reload", str(reference))
        ctx.step, ctx.weight_version = state.step, state.weight_version
        restore_rng(state.rng)
        self.eval_before = dict(state.extra.get("eval_before") or {})
        self.load_throughput_state(state.extra.get(THROUGHPUT_KEY), str(path))
        self.skipped_steps = int(state.extra.get(SKIPPED_STEPS_KEY) or 0)
        self.recipe.load_state(dict(state.extra.get("recipe") or {}))
        from rl_runtime.asynchrony.training import STATE_KEY, restore_rollout_state

        if state.extra.get(STATE_KEY):  # rollout drew ahead of the trainer: back to its batch
            restore_rollout_state(self.recipe, state.extra[STATE_KEY], ctx.step, ctx.weight_version)
        if ctx.sync is not None:  # engines get the restored weights, same version
            ctx.sync_weights(new_version=False)

    # -------------------------------------------------------------------------------- run
    def run(self) -> RunResult:
        """The whole run, holding the locks of its output directory and of its checkpoint
        directory where that lies elsewhere (rl_runtime.run.run_lock) from before anything in them
        is read or moved until teardown: a second run on either directory fails at once, naming
        it and this run's pid.

        SIGINT and SIGTERM (rl_runtime.run.interrupts) end it in order: workers and Ray stopped,
        then summary.json written with the step reached, the last durable checkpoint and the
        command that resumes from it; `RunInterrupted` (carrying the same) is raised on."""
        t0 = time.perf_counter()
        c = self.components
        checkpoints = [c.checkpoint.directory] if c.role("actor_train") is not None else []
        with run_directories_lock(c.output_dir, *checkpoints), handle_interrupts():
            resume, state = self._announce()
            if resume is not None:
                self.last_checkpoint = str(resume)
            after: dict[str, float] = {}
            try:
                ctx = self._setup()
                with long_phase("baselines"):
                    self.baselines = self.recipe.baselines(ctx)
                if resume is not None and state is not None:
                    self.restore(resume, state)
                else:
                    with long_phase("warm-up"):
                        warm = self.recipe.before_training(ctx) or {}
                    if warm:
                        ctx.log(warm, step=0)
                    if self.options.eval_before_training and self.components.cadence.eval_steps:
                        with long_phase("evaluation before training"):
                            self.eval_before = self.recipe.evaluate(ctx)
                        if self.eval_before:
                            ctx.log(self.eval_before)
                self._start_async(ctx, state if resume is not None else None)
                after = self._loop(ctx)
                return self._finish(ctx, t0, self.eval_before, after, resume)
            except RunInterrupted as exc:
                exc.step = self.ctx.step if self.ctx is not None else self.resumed_step
                with stopping():
                    self.teardown()
                    self._write_interrupted(exc, resume)
                raise
            finally:
                with stopping():
                    self.teardown()

    def _write_interrupted(self, exc: RunInterrupted, resume: Path | None) -> None:
        """summary.json of an interrupted run: the signal, the step reached, the last durable
        checkpoint and the command that resumes from it (filled into `exc` too)."""
        exc.checkpoint = self.last_checkpoint
        exc.resume_command = resume_command(self.last_checkpoint)
        summary = {
            "interrupted": exc.name,
            "step": exc.step,
            "last_checkpoint": exc.checkpoint,
            "resume_command": exc.resume_command,
            "resumed_from": str(resume) if resume is not None else None,
            "eval_before": self.eval_before,
            "skipped_steps": self.skipped_steps,
            "throughput": {"scope": "run", **self.throughput_state()},
        }
        write_summary(Path(self.components.output_dir) / SUMMARY_NAME, summary)

    def _start_async(self, ctx: Context, state: RunState | None) -> None:
        """With `components.asynchronous`: start rollout ahead of the trainer, from the step the
        run is at (a resume's lag totals restored)."""
        plan = self.components.asynchronous
        if plan is None:
            return
        from rl_runtime.asynchrony.training import STATE_KEY, AsyncTraining

        self.asynchronous = AsyncTraining(
            plan,
            self.recipe,
            ctx,
            samples_per_batch=self.components.sizes["samples_per_step"],
            start_index=ctx.step,
            stop_index=self.components.cadence.max_steps,
        )
        if state is not None and state.extra.get(STATE_KEY):
            self.asynchronous.lags.load_state(state.extra[STATE_KEY].get("lags") or {})
        producer = self.asynchronous.producer
        if plan.partial_rollout:
            ctx.defer_sync = True
        elif ctx.sync is not None and ctx.sync.can_stage():
            ctx.sync_producer = producer
        else:  # the trainer's sync waits for the batch in flight to end
            ctx.sync_gate = lambda: producer.between_batches(plan.wait_timeout_s)
        self.asynchronous.start()

    def _loop(self, ctx: Context) -> dict[str, float]:
        cad = self.components.cadence
        last_eval: dict[str, float] = {}
        step = self.recipe.step if self.asynchronous is None else self.asynchronous.step
        if ctx.step >= cad.max_steps and cad.eval_steps and self.resumed_step is not None:
            # a finished run resumed: nothing to train, and its result (summary.json, the table)
            # is the final policy's evaluation, taken again (its logged row stays the only one)
            with long_phase("evaluation"):
                return self.recipe.evaluate(ctx)
        with StepProgress(cad.max_steps, ctx.step) as progress:
            while ctx.step < cad.max_steps:
                ctx.timer.reset()
                t0 = time.perf_counter()
                metrics = step(ctx)
                ctx.step += 1
                skipped = skip_reason(metrics)
                self.skipped_steps += skipped is not None
                if self.asynchronous is not None:  # trained and synced: rollout may go on
                    self._open_rollout_gate(ctx)
                last = ctx.step == cad.max_steps
                evaluate = bool(cad.eval_steps) and (last or ctx.step % cad.eval_steps == 0)
                save = self.ckpt is not None and (last or ctx.step % cad.save_steps == 0)
                if evaluate or save or last:  # the engines hold the trained weights
                    ctx.settle_weights()
                self.loop_seconds += time.perf_counter() - t0
                self.samples_trained += metrics.get(TRAINED_SAMPLES_KEY, 0.0)
                if self.samples_trained:  # pipelines that count trained samples (rollout/*)
                    metrics["throughput/samples_per_s"] = self.samples_per_s()
                if evaluate:
                    with long_phase(f"evaluation at step {ctx.step}"):
                        last_eval = self.recipe.evaluate(ctx)
                    metrics.update(last_eval)
                if last or ctx.step % cad.logging_steps == 0:
                    ctx.log(metrics)
                if save:
                    self.save()
                shown = [k for k in self.options.progress_keys if k in metrics]
                line = " ".join(f"{k}={metrics[k]:.3f}" for k in shown)
                progress.advance(
                    {k: v for k, v in metrics.items() if k.startswith("timing/")},
                    f"skipped ({skipped}) {line}".strip() if skipped else line,
                )
        return last_eval

    def _open_rollout_gate(self, ctx: Context) -> None:
        """Tell rollout the trainer has finished `ctx.step` steps once their weights are in the
        engines: at once, when a deferred sync ends (`Context.defer_sync`) or when rollout has
        delivered a posted one (`Context.sync_producer`)."""
        asynchronous, steps = self.asynchronous, ctx.step
        assert asynchronous is not None
        if ctx.sync_producer is not None:
            ctx.sync_producer.when_delivered(lambda: asynchronous.trainer_finished(steps))
        elif ctx.defer_sync and ctx.sync is not None:
            ctx.sync.when_committed(lambda: asynchronous.trainer_finished(steps))
        else:
            asynchronous.trainer_finished(steps)

    def samples_per_s(self) -> float:
        """Trained samples per second of the run's training loop so far (evaluation and
        checkpoints not counted; a resumed run's checkpointed part included)."""
        return self.samples_trained / self.loop_seconds if self.loop_seconds > 0 else 0.0

    def throughput_state(self) -> dict[str, float]:
        """The run's throughput totals so far, as a checkpoint carries them."""
        return {"samples_trained": self.samples_trained, "loop_seconds": self.loop_seconds}

    def load_throughput_state(self, state: dict[str, Any] | None, checkpoint: str) -> None:
        """The run's throughput totals from a checkpoint; one written before they were saved
        counts from the resume (said in a warning)."""
        if state is None:
            print(
                f"warning: checkpoint {checkpoint} records no throughput totals; "
                "throughput/samples_per_s and summary.json's throughput count from this resume",
                flush=True,
            )
            state = {}
        self.samples_trained = float(state.get("samples_trained", 0.0))
        self.loop_seconds = float(state.get("loop_seconds", 0.0))

    def _finish(
        self,
        ctx: Context,
        t0: float,
        before: dict[str, float],
        after: dict[str, float],
        resume: Path | None,
    ) -> RunResult:
        from rl_runtime.track.curves import PANELS, write_curves

        out = Path(self.components.output_dir)
        png = write_curves(
            ctx.tracker.history,
            out / CURVES_NAME,
            panels=PANELS.get(self.pipeline() or ""),
            title=self.components.exp_name,
            baselines={
                f"{name}: {key}": value
                for name, metrics in self.baselines.items()
                for key, value in metrics.items()
            },
        )
        hf_dir = None
        nothing_trained = ctx.step > 0 and self.skipped_steps >= ctx.step
        if self.options.export_hf and self.last_checkpoint is not None and not nothing_trained:
            # what `rl-export` writes from the last checkpoint (rl_runtime.cli.export)
            from rl_runtime.cli.export import export_checkpoint

            hf_dir = str(export_checkpoint(
                self.last_checkpoint, out / HF_MODEL_NAME, base_model=self.options.model_path,
                key_file=self.components.checkpoint.key_file,
            ))  # fmt: skip
        result = RunResult(
            step=ctx.step,
            weight_version=ctx.weight_version,
            wall_seconds=time.perf_counter() - t0,
            eval_before=before,
            eval_after=after,
            resumed_from=str(resume) if resume is not None else None,
            curves=str(png) if png else None,
            hf_model=hf_dir,
            baselines=self.baselines,
            summary=self.recipe.summary(before, after),
            throughput={
                "scope": "run",
                "samples_per_s": self.samples_per_s(),
                "samples_trained": self.samples_trained,
                "loop_seconds": self.loop_seconds,
            },
            skipped_steps=self.skipped_steps,
        )
        result.outputs = run_outputs(self.components, result.curves, hf_dir)
        write_summary(out / SUMMARY_NAME, result.__dict__)
        if nothing_trained:
            raise NothingTrainedError(
                f"every one of the run's {ctx.step} steps was skipped: it trained on nothing "
                "(dynamic sampling kept no group: each group's rewards were all equal, or every "
                "sample was too stale), so the policy is the one it started from. Look at "
                f"reward/mean and reward/accuracy in {out / SUMMARY_NAME} and the logs; give "
                "dynamic sampling more rounds (dynamic_sampling.max_num_gen_batches), more "
                "prompts per step (rollout_batch_size) or samples per prompt "
                "(num_return_sequences_in_group), or turn it off (dynamic_sampling.enable=false)"
            )
        return result

    def teardown(self) -> None:
        ctx = self.ctx
        if ctx is None:
            return
        if self.asynchronous is not None:  # before the cluster: its thread calls the engines
            self.asynchronous.stop()
            self.asynchronous = None
        if ctx.tracker is not None:
            ctx.tracker.close()
        if ctx.cluster is not None:
            ctx.cluster.shutdown()
            ctx.cluster = None
        self.ctx = None


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


def _saved_reference(checkpoint: Path) -> Path:
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
