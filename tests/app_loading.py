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
