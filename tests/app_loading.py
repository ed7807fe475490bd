"""An app's command line (`rl_app_<name>.spec.main`) in-process: what `uv run apps/<name>` runs."""

from __future__ import annotations

import importlib
from collections.abc import Callable
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
