"""rl_runtime.run.resume_guard's patterns for the apps' own sections (`rlvr_app:`, `agentic_app:`,
`dpo_app:`, `sft_app:`, `distill_app:`) name keys those sections have: a renamed option cannot leave its rule behind."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from fnmatch import fnmatchcase
from typing import Any

from rl_runtime.run.resume_guard import RESUME_NOTED, RESUME_REFUSED, app_record


def _leaves(data: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        yield from _leaves(value, path) if isinstance(value, Mapping) else [path]


#: each app and the pipeline kind its resume is checked for (distill trains RLVR's keys)
PIPELINES = {"agentic": "agentic", "rlvr": "rlvr", "dpo": "dpo", "sft": "sft", "distill": "rlvr"}


def _app_keys() -> list[str]:
    """Every dotted key of every app's section, as a checkpoint records it (`app_record`)."""
    keys: list[str] = []
    for name, pipeline in PIPELINES.items():
        module = importlib.import_module(f"rl_app_{name}.options")
        keys += _leaves(app_record(module.AppOptions()))
        # the pipeline kind a resume is checked for (RunOptions.from_app reads it)
        assert pipeline == module.AppOptions.PIPELINE
    return keys


def test_every_app_pattern_names_an_app_key():
    keys = _app_keys()
    assert {k.split(".")[0] for k in keys} == {f"{name}_app" for name in PIPELINES}
    patterns = [p for p in (*RESUME_REFUSED, *RESUME_NOTED) if p.split(".")[0].endswith("_app")]
    assert len(patterns) >= 5
    for pattern in patterns:
        assert any(fnmatchcase(k, pattern) for k in keys), pattern
    # the keys that generate the training prompts are refused
    refused = {k for k in keys if any(fnmatchcase(k, p) for p in RESUME_REFUSED)}
    assert {"rlvr_app.arith_data.seed", "dpo_app.arithmetic.train_rows"} <= refused
    assert "rlvr_app.arith_data.out_dir" not in refused and "rlvr_app.use_ray" not in refused
