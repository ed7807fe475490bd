"""Each shipped app config composes to a committed snapshot, so any change to what a config builds
is a reviewed diff. Regenerate with `RL_UPDATE_SNAPSHOTS=1 uv run pytest tests/test_compose_snapshots.py`."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from rl_config.loading import compose_config
from rl_config.schema import ExperimentConfig
from rl_runtime.compose import compose

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "apps").glob("*/configs/**/*.yaml"))


def _plain(obj):
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if hasattr(obj, "__struct_fields__"):
        return {k: _plain(getattr(obj, k)) for k in obj.__struct_fields__}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, float) and obj == float("inf"):
        return "inf"
    return obj


def _app(path: Path) -> str:
    return path.relative_to(ROOT / "apps").parts[0]


def _name(path: Path) -> str:
    """Snapshot name: the config's stem, prefixed by its app except for apps/agentic's."""
    app = _app(path)
    return path.stem if app == "agentic" else f"{app}_{path.stem}"


def _compose(app: str, cfg) -> Any:
    """What an app composes: dpo its own plan; rlvr the shared components and its RLVR plan."""
    if app == "dpo":
        from rl_runtime.pipelines.dpo.compose import compose_dpo

        return _plain(compose_dpo(cfg, device_kind="cpu"))
    got = _plain(compose(cfg, device_kind="cpu"))
    if app == "rlvr":
        from rl_runtime.pipelines.rlvr.compose import build_rlvr

        got["rlvr"] = _plain(build_rlvr(cfg))
    return got


@pytest.mark.parametrize("path", CONFIGS, ids=_name)
def test_shipped_config_composes_to_its_snapshot(path):
    app = _app(path)
    data = dict(compose_config(path, []).data)
    data.pop(f"{app}_app", None)
    got = _compose(app, ExperimentConfig.model_validate(data))
    snap = ROOT / "tests" / "snapshots" / f"compose_{_name(path)}.json"
    text = json.dumps(got, indent=1, sort_keys=True) + "\n"
    if os.environ.get("RL_UPDATE_SNAPSHOTS"):
        snap.write_text(text)
    assert snap.exists(), f"no snapshot {snap}; run with RL_UPDATE_SNAPSHOTS=1 and review it"
    assert json.loads(snap.read_text()) == json.loads(text), f"{snap} differs from compose()"
