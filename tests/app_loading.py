"""Load an app's command line (`apps/<name>/__main__.py`'s `main`) in-process, as
`uv run apps/<name>` runs it; its __main__ puts the app's directory on sys.path."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

APPS = Path(__file__).resolve().parents[1] / "apps"


def app_main(name: str) -> Callable[..., Any]:
    """`main` of apps/`name` (a fresh module each call)."""
    spec = importlib.util.spec_from_file_location(f"{name}_app_main", APPS / name / "__main__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


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
