"""The command line every app shares: `--config FILE [key=value ...] [--dry-run] [--no-ray]`.

An app describes itself once in an :class:`AppSpec` (its config section and options class, how it
composes a config and runs it, its result table); :func:`app_main` does the rest the same way for
every app: thread defaults, argument parsing (also ROLL's `--config_path/--config_name`), loading,
composing, the dry-run plan, errors as one line on stderr with exit code 1, the result table::

    SPEC = AppSpec(prog="apps/rlvr", default_config=..., section="rlvr_app", options=AppOptions,
                   compose=compose, run=run, title="held-out accuracy", summary_row=summary_row)
    raise SystemExit(app_main(SPEC))
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BASE_FLAGS: dict[str, str] = {
    "dry-run": "print the components and exit",
    "no-ray": "run every worker in this process",
}
"""Flags every app takes; an app adds its own in :attr:`AppSpec.flags`."""


@dataclass
class Composed:
    """What an app's `compose` hands the shared main: the components, and its own plan."""

    components: Any
    #: the app's own plan next to the components (apps/rlvr: `RlvrPlan`)
    plan: Any = None
    #: dry-run warnings beyond the config's and the components'
    notes: tuple[str, ...] = ()
    #: printed by a dry run after the placement
    details: str = ""
    #: what a dry run lists as warnings and a run refuses as a config error
    refusals: tuple[str, ...] = ()
    #: the data files the run reads (rl_runtime.run.preflight.DataFiles), checked before it starts
    data: tuple[Any, ...] = ()


@dataclass(frozen=True)
class AppSpec:
    """One app's command line. `compose(cfg, options, flags)` must be pure (a dry run calls it);
    `run(cfg, options, composed, flags)` builds what the run needs and returns the
    `rl_runtime.run.runner.RunResult`. `flags` are the given flags by Python name (`dry_run`)."""

    prog: str
    default_config: Path
    #: the app's own top-level YAML section (`rlvr_app`), built into `options`
    section: str
    #: a dataclass with `from_mapping(raw)` (see rl_runtime.cli.app_options)
    options: Any
    compose: Callable[[Any, Any, frozenset[str]], Composed]
    run: Callable[[Any, Any, Composed, frozenset[str]], Any]
    #: the result table's title and its columns per evaluation (`row(metrics) -> columns`)
    title: str
    summary_row: Callable[[dict[str, float]], dict[str, float | str]]
    #: the app's own flags on top of BASE_FLAGS
    flags: Mapping[str, str] = field(default_factory=dict)
    before_label: str = "before RL"
    after_label: str = "after RL"
    #: exceptions of a run that are bad input (a data file, its rows): "data error: ..."
    data_errors: tuple[type[BaseException], ...] = ()
    #: what `--help` says the app does (the app's module docstring)
    description: str = ""
    #: `--verl`: the verl entry module a command runs when it gives no `-m`
    verl_entry: str = "verl.trainer.main_ppo"


def load_app(spec: AppSpec, config: Path, overrides: list[str]) -> tuple[Any, Any]:
    """The validated experiment and the app's own options (its `spec.section`)."""
    from rl_config.loading import load_app_config

    cfg, section = load_app_config(config, overrides, section=spec.section)
    return cfg, spec.options.from_mapping(section)


def load_verl_app(spec: AppSpec, verl: Any, overrides: list[str]) -> tuple[Any, Any]:
    """A verl command (`--verl`, rl_config.verl_translate) as the validated experiment and the
    app's options: the translation table is printed first; a refused key is a ConfigError."""
    import tempfile

    from rl_config.verl_translate import translate

    translation = translate(
        overrides, entry=verl.entry, config_file=verl.config_file, config_name=verl.config_name
    )
    print(translation.table(), flush=True)
    translation.raise_if_refused()
    with tempfile.TemporaryDirectory(prefix="verl_config_") as folder:
        path = Path(folder) / "verl_translated.yaml"
        path.write_text(translation.to_yaml(f"{spec.prog} --verl -m {verl.entry}"))
        return load_app(spec, path, [])


def check_requested_device(cfg: Any) -> None:
    """`system_envs.RL_DEVICE` (verl's `trainer.device`): a device kind this host lacks is a
    ConfigError naming it, before anything starts; a kind it has is exported to this process too
    (the driver composes and places for it, rl_sync.device.detect_device_kind)."""
    from rl_config.errors import ConfigError, ConfigIssue
    from rl_sync.device import DEVICE_ENV_VAR, DEVICE_KINDS, is_available

    kind = str(cfg.system_envs.get(DEVICE_ENV_VAR, "")).strip().lower()
    if not kind:
        return
    key = f"system_envs.{DEVICE_ENV_VAR}"
    if kind not in DEVICE_KINDS:
        raise ConfigError(ConfigIssue(key, f"{kind!r} is not a device kind ({DEVICE_KINDS})"))
    if not is_available(kind):  # type: ignore[arg-type]
        raise ConfigError(
            ConfigIssue(
                key,
                f"{kind} requested (verl: trainer.device={kind}), but this host "
                f"has no {kind} device"
                + (" (torch_npu is not importable)" if kind == "npu" else ""),
            )
        )
    os.environ[DEVICE_ENV_VAR] = kind


def app_main(spec: AppSpec, argv: list[str] | None = None) -> int:
    """Run the app on `argv` (sys.argv when None); the process exit code. SIGINT or SIGTERM
    end a run in order (rl_runtime.run.interrupts): its last durable checkpoint and the command
    that resumes from it are printed, and the exit code is 130 or 143, without a traceback."""
    try:
        return _app_main(spec, argv)
    except KeyboardInterrupt:  # before the run's own handling began (loading, composing)
        print("interrupted by SIGINT before the run started; nothing was written", file=sys.stderr)
        return 130


def _app_main(spec: AppSpec, argv: list[str] | None) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from rl_config.cli_args import parse_app_args
    from rl_config.errors import ConfigError
    from rl_runtime.run.preflight import check_devices, preflight
    from rl_runtime.run.run_lock import RunDirectoryInUseError
    from rl_runtime.run.runner import (
        NothingTrainedError,
        check_embedded_cpus,
        check_in_process,
        plan_text,
        print_result,
    )
    from rl_sync.device import DeviceUnavailableError
    from rl_train.signing import CheckpointError

    try:
        args = parse_app_args(
            argv,
            flags={**BASE_FLAGS, **spec.flags},
            default_config=spec.default_config,
            prog=spec.prog,
            description=spec.description,
            verl_entry=spec.verl_entry,
        )
        if args.verl is not None:
            cfg, options = load_verl_app(spec, args.verl, args.overrides)
        else:
            assert args.config is not None, "every app has a default config"
            cfg, options = load_app(spec, args.config, args.overrides)
        check_requested_device(cfg)  # verl's trainer.device; then RL_DEVICE of the environment
        check_devices(cfg)  # composing detects the device kind: one asked for must be here
        composed = spec.compose(cfg, options, args.flags)
        if composed.refusals and "dry_run" not in args.flags:  # a dry run lists them below
            return _error("config error", "; ".join(composed.refusals))  # before the host's
        if "no_ray" in args.flags:
            options.use_ray = False
        report = preflight(cfg, composed.components, app=options, data=composed.data,
                           use_ray=options.use_ray, num_cpus=options.num_cpus,
                           cpu_per_bundle=options.cpu_per_bundle,
                           packages_required="dry_run" not in args.flags)  # fmt: skip
        if "dry_run" not in args.flags:
            report.raise_if_problems()  # before anything is built, moved or started
        placement = plan_text(composed.components)  # a placement the cluster cannot make fails here
    except DeviceUnavailableError as exc:  # RL_DEVICE names a device this host cannot use
        return _error("device error", exc)
    except (ConfigError, ValueError, KeyError) as exc:
        return _error("config error", exc)
    for note in report.notes:
        print(f"note: {note}", flush=True)
    in_process_warnings: list[str] = []
    if "no_ray" in args.flags:
        try:  # every worker in this process: refused here, a dry run included
            in_process_warnings = check_in_process(composed.components, use_ray=False)
        except ConfigError as exc:
            return _error("config error", exc)
    try:  # more CPUs than the embedded Ray cluster holds: refused before it starts
        check_embedded_cpus(composed.components, options)
    except ConfigError as exc:
        return _error("config error", exc)
    if "dry_run" in args.flags:  # (a run's Runner prints the in-process warnings itself)
        warnings = (
            *cfg.config_warnings(),
            *composed.components.warnings,
            *composed.notes,
            *in_process_warnings,
        )
        for line in (*warnings, *composed.refusals):
            print(f"warning: {line}")
        print(placement)
        if composed.details:
            print(composed.details, flush=True)
        if report.problems:  # the plan above holds; this host cannot run it
            return _error(
                "preflight error",
                f"this host cannot run the plan above ({len(report.problems)} problem(s)):\n"
                + "\n".join(f"  - {problem}" for problem in report.problems),
            )
        return 0
    from rl_runtime.run.interrupts import RunInterrupted, handle_interrupts, set_command

    set_command(spec.prog, sys.argv[1:] if argv is None else argv)
    try:
        with handle_interrupts():
            result = spec.run(cfg, options, composed, args.flags)
    except RunInterrupted as exc:
        print(exc.report(), file=sys.stderr, flush=True)
        return exc.exit_code
    except ConfigError as exc:  # e.g. an optional package the config needs is missing
        return _error("config error", exc)
    except spec.data_errors as exc:
        return _error("data error", exc)
    except CheckpointError as exc:  # resume_from_checkpoint names no checkpoint that verifies
        return _error("checkpoint error", exc)
    except RunDirectoryInUseError as exc:  # another run writes to this output_dir
        return _error("error", exc)
    except NothingTrainedError as exc:  # every step skipped: no results table
        return _error("error", exc)
    print_result(result, spec.title, spec.summary_row, spec.before_label, spec.after_label)
    return 0


def _error(kind: str, what: object) -> int:
    print(f"{kind}: {what}", file=sys.stderr)
    return 1
