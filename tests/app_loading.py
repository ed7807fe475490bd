"""An app's command line (`rl_app_<name>.spec.main`) in-process: what `uv run apps/<name>` runs."""

from __future__ import annotations

import contextlib
import importlib
import io
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def app_main(name: str) -> Callable[..., Any]:
    """`main` of apps/`name` (the package rl_app_`name`)."""
    return importlib.import_module(f"rl_app_{name}.spec").main


# What a preflight reports about this host (not the config): a model or data file that is not
# here, more devices than it has. A dry run still prints the whole plan before them.
HOST_PROBLEM_KEYS = ("pretrain", "placement", "data_args.file_name", "data_args.eval_file_name",
                     "model_name_or_path", "reward_pretrain")  # fmt: skip


def assert_planned(code: int, err: str) -> None:
    """A dry run planned the config: exit 0, or exit 1 with only this host's preflight problems
    (the plan is on stdout either way; a config error is never one of these)."""
    if code == 0:
        return
    assert code == 1 and err.startswith("preflight error: this host cannot run the plan"), err
    problems = [line.strip()[2:] for line in err.splitlines()[1:] if line.strip().startswith("- ")]
    assert problems, err
    for problem in problems:
        key = problem.split(":", 1)[0]
        assert any(part in key for part in HOST_PROBLEM_KEYS), problem


def run_in_process(name: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """apps/`name`'s command line `argv` run in this process from `cwd`, as a finished process:
    its exit code and what it printed to stdout and stderr."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with (
        contextlib.chdir(cwd),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        try:
            code = app_main(name)(argv)
        except SystemExit as exit_:  # argparse's --help (0) and usage errors (2)
            code = 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 1
    return subprocess.CompletedProcess(argv, code, stdout.getvalue(), stderr.getvalue())


def run_app(
    name: str, argv: list[str], cwd: Path, *, as_subprocess: bool = False
) -> subprocess.CompletedProcess[str]:
    """apps/`name`'s command line `argv` from `cwd`: in this process (`run_in_process`: no
    second interpreter importing torch, ~6 s a run), or `as_subprocess`, as a user runs it."""
    if not as_subprocess:
        return run_in_process(name, argv, cwd)
    app = Path(__file__).resolve().parents[1] / "apps" / name
    return subprocess.run([sys.executable, str(app), *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=1500)  # fmt: skip
