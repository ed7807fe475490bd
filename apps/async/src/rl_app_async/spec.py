"""`uv run apps/async [--config FILE] [key=value ...] [--dry-run]`

Runs apps/rlvr's recipe twice on the same config and devices, synchronously
(`async.max_staleness=0`) and then asynchronously (`async.max_staleness` of the command line, else
of the config file, else 1 = one-step-off), and prints side by side the trained samples per second
and the held-out accuracy; output_dir/summary.json holds `sync.*` and `async.*` (`samples_per_s`, `heldout_accuracy`, ...) and
`speedup`. Without --config: apps/rlvr's CPU default with rollout and training on separate CPU
bundles and a step balanced between the two (rl_app_async.compare.CPU_DEFAULTS). key=value
overrides apply to both runs.

`uv run apps/async --verl [-m MODULE] KEY=VALUE ...` runs a verl asynchronous recipe command once,
as verl would: `recipe.one_step_off_policy.main_ppo` (the default; `async.max_staleness: 1`) or
`recipe.fully_async_policy.fully_async_main` (rl_config.verl_translate prints the table first).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

FLAGS = {"dry-run": "print both runs' components and exit"}
VERL_ENTRY = "recipe.one_step_off_policy.main_ppo"
"""`--verl` without `-m`: verl's one-step-off recipe (`-m ...fully_async_main`: fully async)."""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(a == "--verl" or a.startswith("--verl-config") for a in args):
        # a verl recipe command is one run, as verl runs it: apps/rlvr's recipe, asynchronous
        import dataclasses

        from rl_app_rlvr.spec import SPEC
        from rl_runtime.cli.app_main import app_main

        spec = dataclasses.replace(SPEC, prog="apps/async", verl_entry=VERL_ENTRY,
                                   description=__doc__ or "")  # fmt: skip
        return app_main(spec, list(args))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from rl_app_async.compare import (
        CPU_DEFAULTS,
        async_staleness,
        held_out,
        run_overrides,
        run_summary,
        split_async_only,
        split_staleness,
        step_rows,
        table_rows,
    )
    from rl_app_rlvr import spec as rlvr  # the recipe this app runs twice
    from rl_app_rlvr.spec import DEFAULT_CONFIG, compose, data_errors, load
    from rl_config.cli_args import parse_app_args
    from rl_config.errors import ConfigError
    from rl_runtime.run.checks import check_embedded_cpus, check_in_process
    from rl_runtime.run.interrupts import RunInterrupted
    from rl_runtime.run.plan import plan_text
    from rl_runtime.run.preflight import check_devices, preflight
    from rl_runtime.run.report import NothingTrainedError

    try:
        args = parse_app_args(
            argv,
            flags=FLAGS,
            default_config=DEFAULT_CONFIG,
            prog="apps/async",
            description=__doc__ or "",
        )
        defaults = [f"{k}={v}" for k, v in CPU_DEFAULTS.items()]
        base, given = split_staleness(
            ([] if args.config != DEFAULT_CONFIG else defaults) + list(args.overrides)
        )
        base, async_only = split_async_only(base)
        cfg, app0 = load(args.config, base)
        if not app0.use_ray and args.config == DEFAULT_CONFIG:
            # the default's partial rollout needs Ray: left out (the defaults come first, so
            # `remove` takes theirs; the same key given by the user stays, and is refused)
            for item in split_async_only(defaults)[1]:
                async_only.remove(item)
        staleness = async_staleness(given, cfg.async_.max_staleness)
        runs = {}
        for mode, bound in (("sync", 0), ("async", staleness)):
            overrides = run_overrides(base, cfg.output_dir, mode, bound)
            overrides += async_only if bound else []
            run_cfg, app = load(args.config, overrides)
            check_devices(run_cfg)
            runs[mode] = (run_cfg, app, compose(run_cfg, app))
            check_embedded_cpus(runs[mode][2].components, app)  # before Ray waits for them
            check_in_process(runs[mode][2].components, app.use_ray)  # not after the sync run
            preflight(run_cfg, runs[mode][2].components, app=app, data=runs[mode][2].data,
                      use_ray=app.use_ray, num_cpus=app.num_cpus, cpu_per_bundle=app.cpu_per_bundle,
                      packages_required="dry_run" not in args.flags).raise_if_problems()  # fmt: skip
    except (ConfigError, ValueError, KeyError) as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    if "dry_run" in args.flags:  # as apps/rlvr's: refusals are listed, a run stops on them
        for mode, (run_cfg, _app, composed) in runs.items():
            print(f"=== {mode} run")
            for line in (*run_cfg.config_warnings(), *composed.components.warnings,
                         *composed.notes, *composed.refusals):  # fmt: skip
                print(f"warning: {line}")
            print(plan_text(composed.components))
        return 0
    refusals = dict.fromkeys(r for _cfg, _app, composed in runs.values() for r in composed.refusals)
    if refusals:
        print(f"config error: {'; '.join(refusals)}", file=sys.stderr)
        return 1
    from rl_runtime.track.summary_json import write_summary

    summary: dict = {"max_staleness": staleness}
    results = {}
    out = Path(cfg.output_dir)
    for mode, (run_cfg, app, composed) in runs.items():
        print(f"=== {mode} run (async.max_staleness={0 if mode == 'sync' else staleness})")
        # the pre-RL policy is the same in both runs: evaluate it once. A fresh run moves an
        # earlier comparison's summary.json aside with its own outputs (rl_runtime.run.previous_run)
        try:
            results[mode] = rlvr.run(run_cfg, app, composed, eval_before=mode == "sync",
                                app_outputs=(str(out / "summary.json"),))  # fmt: skip
        except ConfigError as exc:  # e.g. an optional package the config needs is missing
            print(f"config error: {exc}", file=sys.stderr)
            return 1
        except data_errors() as exc:
            print(f"data error: {exc}", file=sys.stderr)
            return 1
        except NothingTrainedError as exc:  # every step skipped: no comparison to make
            print(f"error ({mode} run): {exc}", file=sys.stderr)
            return 1
        except RunInterrupted as exc:  # SIGINT / SIGTERM: the run stopped in order
            print(exc.report(), file=sys.stderr)
            return exc.exit_code
        before = results["sync"].eval_before  # the pre-RL policy, evaluated once
        summary[mode] = run_summary(results[mode], step_rows(run_cfg.logging_dir), before)
    summary["heldout_accuracy_before_rl"] = results["sync"].eval_before.get("val/accuracy")
    summary["heldout_before_rl"] = held_out(results["sync"].eval_before)
    if summary["sync"]["samples_per_s"]:
        summary["speedup"] = round(
            summary["async"]["samples_per_s"] / summary["sync"]["samples_per_s"], 3
        )
    write_summary(out / "summary.json", summary)
    from rich.console import Console

    from rl_runtime.track.timing import summary_table

    console = Console(width=160)
    console.print(summary_table("synchronous vs asynchronous RLVR", table_rows(summary)))
    before_rl = ", ".join(f"{k} {v:.3f}" for k, v in summary["heldout_before_rl"].items())
    console.print(
        f"speedup (samples/s): {summary.get('speedup')}  held-out before RL: "
        f"{before_rl or '-'}  summary: {out / 'summary.json'}"
    )
    return 0
