"""app_main: the command line every app shares (loading, composing, dry run, error lines)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

from rl_runtime.cli.app_main import AppSpec, Composed, app_main
from rl_runtime.cli.app_options import AppRunOptions


@dataclass
class _Options(AppRunOptions):
    SECTION = "x_app"
    greeting: str = "hi"


class _DataError(Exception):
    pass


@functools.cache
def _tiny_model() -> str:
    import atexit
    import contextlib
    import io
    import shutil
    import tempfile

    from rl_rollout.tiny_model import build_tiny_model

    root = tempfile.mkdtemp(prefix="app-main-model-")
    atexit.register(shutil.rmtree, root, True)  # one per test process, removed when it ends
    # built inside whichever test comes first: its save's progress bar must not reach that
    # test's captured stderr, which several tests compare line for line
    with contextlib.redirect_stderr(io.StringIO()):
        return str(build_tiny_model(Path(root) / "model"))


def _spec(tmp_path: Path, *, refusals=(), fail: Exception | None = None, runs: list | None = None,
          config_text: str = ""):  # fmt: skip
    config = tmp_path / "x.yaml"
    model = _tiny_model()  # a model that is there (a missing one stops every run first)
    config.write_text(f"pretrain: {model}\nx_app:\n  greeting: hello\n" + config_text)

    def compose(cfg, options, flags):
        from rl_runtime.run.plan import compose_here

        return Composed(compose_here(cfg), plan="PLAN", notes=("a note",), details="DETAILS",
                        refusals=tuple(refusals))  # fmt: skip

    def run(cfg, options, composed, flags):
        if fail is not None:
            raise fail
        assert runs is not None
        runs.append((options, composed.plan, flags))
        raise SystemExit(0)  # the test stops before a real run

    return AppSpec(prog="apps/x", default_config=config, section="x_app", options=_Options,
                   compose=compose, run=run, title="t", summary_row=dict,
                   flags={"extra-flag": "an app's own flag"}, data_errors=(_DataError,))  # fmt: skip


def test_dry_run_prints_placement_plan_notes_and_refusals(tmp_path, capsys):
    assert app_main(_spec(tmp_path, refusals=("cannot score X",)), ["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "warning: a note" in out and "warning: cannot score X" in out
    assert "actor_train  strategy=" in out and out.rstrip().endswith("DETAILS")


def test_a_run_is_refused_with_what_a_dry_run_lists(tmp_path, capsys):
    runs: list = []
    assert app_main(_spec(tmp_path, refusals=("cannot score X",), runs=runs), []) == 1
    assert "config error: cannot score X" in capsys.readouterr().err
    assert runs == []


def test_options_flags_and_no_ray_reach_the_run(tmp_path):
    runs: list = []
    with pytest.raises(SystemExit):
        app_main(_spec(tmp_path, runs=runs), ["--no-ray", "--extra-flag", "x_app.greeting=bye"])
    ((options, plan, flags),) = runs
    assert options.greeting == "bye" and options.use_ray is False and plan == "PLAN"
    assert flags == {"no_ray", "extra_flag"}


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["x_app.greting=1"], "config error: x_app: unknown key(s) ['greting']"),
        (["max_step=3"], "config error: invalid config"),
    ],
)
def test_bad_keys_are_one_config_error_line(tmp_path, capsys, argv, error):
    assert app_main(_spec(tmp_path, runs=[]), argv) == 1
    assert capsys.readouterr().err.startswith(error)


def test_errors_of_a_run_name_their_kind(tmp_path, capsys):
    from rl_config.errors import ConfigError, ConfigIssue
    from rl_train.signing import CheckpointError

    assert app_main(_spec(tmp_path, fail=_DataError("rows.jsonl: row 3: no prompt")), []) == 1
    assert capsys.readouterr().err == "data error: rows.jsonl: row 3: no prompt\n"
    missing = ConfigError([ConfigIssue("track_with", "wandb is not installed")])
    assert app_main(_spec(tmp_path, fail=missing), []) == 1
    assert "config error:" in capsys.readouterr().err
    unverified = CheckpointError("resume_from_checkpoint: no valid checkpoint under /etc/passwd")
    assert app_main(_spec(tmp_path, fail=unverified), []) == 1  # was a traceback
    assert capsys.readouterr().err == f"checkpoint error: {unverified}\n"
    from rl_runtime.run.run_lock import RunDirectoryInUseError

    in_use = RunDirectoryInUseError("output directory /x is in use by another run (pid 7)")
    assert app_main(_spec(tmp_path, fail=in_use), []) == 1
    assert capsys.readouterr().err == f"error: {in_use}\n"
    from rl_runtime.run.report import NothingTrainedError

    nothing = NothingTrainedError("every one of the run's 2 steps was skipped")
    assert app_main(_spec(tmp_path, fail=nothing), []) == 1  # no results table
    captured = capsys.readouterr()
    assert captured.err == f"error: {nothing}\n" and captured.out == ""
    with pytest.raises(RuntimeError):  # anything else is a bug: not turned into a line
        app_main(_spec(tmp_path, fail=RuntimeError("boom")), [])


@pytest.mark.parametrize("dry_run", [False, True])
def test_no_ray_refuses_a_training_role_of_several_ranks(tmp_path, capsys, dry_run):
    two_ranks = "num_gpus_per_node: 2\nactor_train:\n  device_mapping: [0, 1]\n"
    runs: list = []
    argv = ["--no-ray", *(["--dry-run"] if dry_run else [])]
    assert app_main(_spec(tmp_path, runs=runs, config_text=two_ranks), argv) == 1
    assert "actor_train.device_mapping: 2 ranks" in capsys.readouterr().err
    assert runs == []
    with pytest.raises(SystemExit):  # with Ray each rank has its own process
        app_main(_spec(tmp_path, runs=runs, config_text=two_ranks), [])
    assert len(runs) == 1


def test_no_ray_dry_run_warns_about_the_keys_only_ray_reads(tmp_path, capsys):
    text = "weight_sync_host: 10.0.0.5\n"
    assert app_main(_spec(tmp_path, config_text=text), ["--no-ray", "--dry-run"]) == 0
    assert (
        "warning: weight_sync_host='10.0.0.5' has no effect without Ray" in capsys.readouterr().out
    )
    assert app_main(_spec(tmp_path, config_text=text), ["--dry-run"]) == 0
    assert "has no effect without Ray" not in capsys.readouterr().out


@pytest.mark.parametrize("dry_run", [False, True])
def test_more_cpus_than_the_embedded_ray_cluster_holds_are_refused_before_it_starts(
    tmp_path, capsys, monkeypatch, dry_run
):
    """2 device bundles x 2 CPUs on a cluster of 2 CPUs: Ray would wait rpc_timeout (900 s in the
    CPU defaults) for placement groups that can never be placed."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    text = "num_gpus_per_node: 2\nactor_infer:\n  device_mapping: [1]\n"
    cpus = ["x_app.num_cpus=2", "x_app.cpu_per_bundle=2"]
    runs: list = []
    flags = ["--dry-run"] if dry_run else []
    assert app_main(_spec(tmp_path, runs=runs, config_text=text), [*flags, *cpus]) == 1
    err = capsys.readouterr().err
    assert "placement: CPU: the placement needs 4 (2 device bundle(s) x cpu_per_bundle 2)" in err
    assert "the cluster has 2" in err and "raise num_cpus" in err
    assert runs == []
    # without Ray there is no cluster to fit; with enough CPUs the run goes ahead
    assert (
        app_main(_spec(tmp_path, runs=runs, config_text=text), ["--dry-run", "--no-ray", *cpus])
        == 0
    )
    assert (
        app_main(
            _spec(tmp_path, runs=runs, config_text=text), ["--dry-run", *cpus, "x_app.num_cpus=4"]
        )
        == 0
    )


def test_rl_device_npu_without_torch_npu_is_one_device_error_line(tmp_path, capsys, monkeypatch):
    import rl_sync.device as device

    spec = _spec(tmp_path)  # its model built before nothing imports any more
    capsys.readouterr()
    monkeypatch.setattr(device, "torch_npu_module", lambda: None)
    monkeypatch.setattr(device.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv(device.DEVICE_ENV_VAR, "npu")
    assert app_main(spec, ["--dry-run"]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("config error: invalid config (1 error):"), err  # the preflight's check
    assert "RL_DEVICE (environment): asks for npu devices, but this host has none" in err
    assert "torch_npu is not importable" in err and "remove it" in err
    assert "Traceback" not in captured.out + captured.err


@pytest.mark.parametrize(("name", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_during_a_run_is_a_report_and_its_exit_code(tmp_path, capsys, name, code):
    import os
    import signal
    import time

    from rl_runtime.run.interrupts import RunInterrupted

    def run(cfg, options, composed, flags):  # what the Runner raises once it has stopped
        try:
            os.kill(os.getpid(), getattr(signal, name))
            time.sleep(5)
        except RunInterrupted as exc:
            exc.step, exc.checkpoint = 2, "/out/ckpt/step-000002"
            from rl_runtime.run.interrupts import resume_command

            exc.resume_command = resume_command(exc.checkpoint)
            raise

    spec = _spec(tmp_path, runs=[])
    from dataclasses import replace

    assert app_main(replace(spec, run=run), ["max_steps=3"]) == code
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"interrupted by {name} at step 2: workers and Ray stopped",
        "last durable checkpoint: /out/ckpt/step-000002",
        "resume with: uv run apps/x max_steps=3 resume_from_checkpoint=/out/ckpt/step-000002",
    ]
