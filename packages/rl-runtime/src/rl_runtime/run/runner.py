"""The run skeleton shared by apps: `Runner(cfg, components, recipe, options).run()`.

The runner owns what every pipeline needs (seeding, the cluster, tracker, weight sync, checkpoint
manager and resume; the cadence of logging/eval/save, progress, summary; teardown in `finally`).
A recipe supplies its science through hooks (rl_runtime.run.recipe); it sees the run through a
`rl_runtime.run.context.Context`. The last step always logs, evaluates and saves.
At start the runner prints the config warnings and writes the resolved config (secrets redacted)
to output_dir; at the end it writes output_dir/summary.json (standard JSON: rl_runtime.track.summary_json).
One run at a time per output_dir, and per checkpoint directory where that lies outside it: the run
holds their locks (rl_runtime.run.run_lock) for its life, and a second run on either fails at once
naming the directory and the first run's pid.
A checkpoint records the config, the app's own section (`RunOptions.app_record`), the values it
derives for its data (`RunOptions.derived`) and the evaluation before training, which a resumed
run's summary keeps; how a run resumes or starts fresh: rl_runtime.run.start.
Throughput is the whole run's (rl_runtime.track.throughput); `wall_seconds` is this invocation's.
With `components.asynchronous`, rollout runs ahead of the trainer (rl_runtime.asynchrony.training).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rl_runtime.asynchrony.training import open_rollout_gate
from rl_runtime.cli.export import MODEL_CONFIG_KEY, MODEL_PATH_KEY
from rl_runtime.compose import RunComponents, role_specs
from rl_runtime.run.checks import sandbox_hidden_env
from rl_runtime.run.context import Context
from rl_runtime.run.interrupts import RunInterrupted, handle_interrupts, resume_command, stopping
from rl_runtime.run.options import RunOptions, RunResult
from rl_runtime.run.previous_run import CURVES_NAME, HF_MODEL_NAME, SUMMARY_NAME
from rl_runtime.run.recipe import Recipe
from rl_runtime.run.report import NothingTrainedError, interrupted_summary, run_outputs
from rl_runtime.run.resume_guard import config_record
from rl_runtime.run.run_lock import run_directories_lock
from rl_runtime.run.start import announce, saved_reference, set_aside_and_record
from rl_runtime.state.checkpoint import RunCheckpoints, RunState, capture_rng, restore_rng
from rl_runtime.state.recorder import recorder_for
from rl_runtime.state.seeds import seed_globals
from rl_runtime.step.metrics import TRAINED_SAMPLES_KEY, skip_reason
from rl_runtime.track.summary_json import write_summary
from rl_runtime.track.throughput import Throughput
from rl_runtime.track.timing import PhaseTimer, StepProgress, long_phase
from rl_runtime.track.tracking import Tracker

THROUGHPUT_KEY = "throughput"
"""The checkpoint's extra state holding the run's throughput totals (`Runner.throughput_state`)."""
WARMED_UP_KEY = "started_from_warm_up"
"""Checkpoint state: RL started from a supervised warm-up's policy, not `pretrain`; a reference
role held that policy, and its weights are in the checkpoint's `reference/`."""
SKIPPED_STEPS_KEY = "skipped_steps"
"""Checkpoint state: the run's steps so far that trained on nothing (rl_runtime.step.metrics.skip_reason)."""


class Runner:
    def __init__(
        self, cfg: Any, components: RunComponents, recipe: Recipe, options: RunOptions
    ) -> None:
        self.cfg = cfg
        self.components = components
        self.recipe = recipe
        self.options = options
        self.ckpt: RunCheckpoints | None = None
        self.ctx: Context | None = None
        self.baselines: dict[str, dict[str, float]] = {}
        self.asynchronous: Any = None  # rl_runtime.asynchrony.training.AsyncTraining, while running
        self.throughput = Throughput()
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
        """The resume line and warnings, and what is refused before anything starts
        (rl_runtime.run.start.announce)."""
        start = announce(self.cfg, self.components, self.options, self.pipeline())
        self.ckpt, self.resumed_rows = start.ckpt, start.resumed_rows
        self.resumed_step = start.state.step if start.state is not None else None
        return start.resume, start.state

    def _setup(self) -> Context:
        from rl_runtime.cluster.cluster import Cluster
        from rl_runtime.cluster.ray_setup import RayOptions
        from rl_runtime.cluster.weight_sync import weight_sync_for
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
            set_aside_and_record(self.cfg, c, o, self.ckpt, fresh=self.resumed_step is None)
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
        self.ctx.recorder = recorder_for(c, config_record(self.cfg))
        self.ctx.sync = weight_sync_for(cluster, c, use_ray=o.use_ray)
        self.recipe.setup(self.ctx)
        return self.ctx

    # ------------------------------------------------------------------------ checkpoints
    def _optimizer_roles(self) -> list[str]:
        """The roles with an optimizer (checkpointed and restored): actor_train and critic,
        whatever their configured loss (SFT's actor_train has none: it trains with `"sft"`)."""
        return [r.role for r in self.components.roles if r.role in ("actor_train", "critic")]

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
            MODEL_CONFIG_KEY: {  # and the config overrides its config.json carries
                r.role: r.config_overrides for r in self.components.roles if r.config_overrides
            },
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
        saved = self.ckpt.save_run(state, write)
        self.last_checkpoint = str(saved)
        return saved

    def restore(self, path: Path, state: RunState) -> None:
        ctx = self.ctx
        assert ctx is not None and self.ckpt is not None
        ctx.warmed_up = bool(state.extra.get(WARMED_UP_KEY))
        reference = (
            saved_reference(path) if ctx.warmed_up and ctx.cluster.has("reference") else None
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
        summary = interrupted_summary(exc, resume, self.eval_before, self.skipped_steps)
        summary["throughput"] = {"scope": "run", **self.throughput_state()}
        write_summary(Path(self.components.output_dir) / SUMMARY_NAME, summary)

    def _start_async(self, ctx: Context, state: RunState | None) -> None:
        """With `components.asynchronous`: rollout starts ahead of the trainer, from the step the
        run is at (rl_runtime.asynchrony.training.start_async_training)."""
        plan = self.components.asynchronous
        if plan is None:
            return
        from rl_runtime.asynchrony.training import STATE_KEY, start_async_training

        self.asynchronous = start_async_training(
            plan,
            self.recipe,
            ctx,
            samples_per_batch=self.components.sizes["samples_per_step"],
            stop_index=self.components.cadence.max_steps,
            saved=state.extra.get(STATE_KEY) if state is not None else None,
        )

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
                if ctx.recorder is not None:  # the records completed (all of them at the end)
                    done = ctx.step + 1 == cad.max_steps
                    metrics.update(ctx.recorder.step_metrics(ctx.step + 1, wait=done))
                ctx.step += 1
                skipped = skip_reason(metrics)
                self.skipped_steps += skipped is not None
                if self.asynchronous is not None:  # trained and synced: rollout may go on
                    open_rollout_gate(self.asynchronous, ctx)
                last = ctx.step == cad.max_steps
                evaluate = bool(cad.eval_steps) and (last or ctx.step % cad.eval_steps == 0)
                save = self.ckpt is not None and (last or ctx.step % cad.save_steps == 0)
                if evaluate or save or last:  # the engines hold the trained weights
                    ctx.settle_weights()
                self.throughput.add(metrics.get(TRAINED_SAMPLES_KEY, 0.0), time.perf_counter() - t0)
                if self.throughput.samples_trained:  # pipelines that count trained samples
                    metrics["throughput/samples_per_s"] = self.throughput.samples_per_s()
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

    def throughput_state(self) -> dict[str, float]:
        return self.throughput.state()

    def load_throughput_state(self, state: dict[str, Any] | None, checkpoint: str) -> None:
        self.throughput.load_state(state, checkpoint)

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
            panels=PANELS.get(self.options.curve_panels or self.pipeline() or ""),
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
            throughput=self.throughput.summary(),
            skipped_steps=self.skipped_steps,
        )
        result.outputs = run_outputs(self.components, result.curves, hf_dir)
        write_summary(out / SUMMARY_NAME, result.__dict__)
        if nothing_trained:
            raise NothingTrainedError.after(ctx.step, out / SUMMARY_NAME)
        return result

    def teardown(self) -> None:
        ctx = self.ctx
        if ctx is None:
            return
        if self.asynchronous is not None:  # before the cluster: its thread calls the engines
            self.asynchronous.stop()
            self.asynchronous = None
        if ctx.recorder is not None:  # its writes finish before the workers go
            recorder, ctx.recorder = ctx.recorder, None
            recorder.close()
        if ctx.tracker is not None:
            ctx.tracker.close()
        if ctx.cluster is not None:
            ctx.cluster.shutdown()
            ctx.cluster = None
        self.ctx = None
