"""Where a run's model comes from: the one place a model name becomes a local directory.

`resolve_model(name, key=...)` returns the absolute local directory of the model `name` names:

* an existing local directory (it must hold a `config.json`);
* a hub id (`Qwen/Qwen2.5-0.5B-Instruct`) already in the local Hugging Face cache (the snapshot
  directory `huggingface_hub` downloaded before), or, when `USE_MODELSCOPE` is set (ROLL's
  switch: in the environment or in the config's `system_envs`), in ModelScope's local cache
  through its snapshot API (the optional `modelscope` package).

Nothing is downloaded and nothing is substituted: a model that is not there is a `ConfigError`
naming the key, the path or hub id and what to do (download it first; give a local directory;
ModelScope). Workers get the resolved directory, so they never reach for a hub either.

A tiny model is built only where an app asks for it by name: `<app>.build_tiny_model` is the
directory to build it in, and it is built only when `pretrain` names that same directory
(`tiny_model_to_build`). A `pretrain` the user gives elsewhere is loaded, never created or
overwritten; a directory at the build path that this stack did not build is never overwritten.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl_config.errors import ConfigError, ConfigIssue

MODELSCOPE_SWITCH = "USE_MODELSCOPE"
"""ROLL's switch: model ids resolve through ModelScope instead of the Hugging Face hub."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_TRUE = ("1", "true", "yes", "on")


def modelscope_enabled(system_envs: Mapping[str, Any] | None = None) -> bool:
    """Whether `USE_MODELSCOPE` is on: the config's `system_envs` first, else the environment."""
    value = (system_envs or {}).get(MODELSCOPE_SWITCH, os.environ.get(MODELSCOPE_SWITCH, ""))
    return str(value).strip().lower() in _TRUE


def is_hub_id(name: str) -> bool:
    """Whether `name` has the form of a hub id (`org/name` or `name`), not of a path
    (`/abs`, `./rel`, `~/x`, `a/b/c`)."""
    return bool(_HUB_ID.match(name)) and not name.startswith(".")


def resolve_model(
    name: str, *, key: str = "pretrain", system_envs: Mapping[str, Any] | None = None
) -> str:
    """The absolute local directory of the model `name` (see the module docstring); a
    `ConfigError` naming `key` when it is not there."""
    path = Path(name).expanduser()
    if path.exists():
        return _local_model(path, name, key)
    if not is_hub_id(name):
        raise ConfigError(
            ConfigIssue(
                key,
                f"model directory {name} does not exist ({path.absolute()}); nothing is built "
                "or downloaded in its place. Give the directory of a Hugging Face model "
                "(config.json, weights, tokenizer files), or a hub id downloaded first",
            )
        )
    if modelscope_enabled(system_envs):
        return _modelscope_cached(name, key)
    return _hf_cached(name, key)


def _local_model(path: Path, name: str, key: str) -> str:
    if not path.is_dir() or not (path / "config.json").is_file():
        what = "is not a directory" if not path.is_dir() else "has no config.json"
        raise ConfigError(
            ConfigIssue(
                key,
                f"{name} {what}: a model is the directory of a Hugging Face model (config.json, "
                "weights, tokenizer files)",
            )
        )
    return str(path.resolve())


def _download_hint(name: str) -> str:
    return (
        f"download it first (`hf download {name}`, or `huggingface-cli download {name}`) on a "
        "machine with network access to this cache, or give the model's local directory; with "
        f"{MODELSCOPE_SWITCH}=1 it is taken from ModelScope's cache instead "
        f"(`modelscope download --model {name}`)"
    )


def _hf_cached(name: str, key: str) -> str:
    from huggingface_hub import constants, snapshot_download

    try:
        found = snapshot_download(name, local_files_only=True)
    except Exception:  # not cached (LocalEntryNotFoundError), a bad id ...
        found = None
    if found is None or not (Path(found) / "config.json").is_file():
        raise ConfigError(
            ConfigIssue(
                key,
                f"{name} is not a local directory, and the hub id is not in the Hugging Face "
                f"cache ({constants.HF_HUB_CACHE}); nothing is downloaded at run time: "
                + _download_hint(name),
            )
        )
    return str(Path(found).resolve())


def _modelscope_cached(name: str, key: str) -> str:
    import importlib

    try:  # not a dependency: ModelScope users install it (ROLL's USE_MODELSCOPE switch)
        snapshot_download = importlib.import_module("modelscope").snapshot_download
    except (ImportError, AttributeError):
        raise ConfigError(
            ConfigIssue(
                key,
                f"{MODELSCOPE_SWITCH} is set, so {name} is taken from ModelScope, but the "
                "modelscope package is not installed: `pip install modelscope` (or `uv pip "
                f"install modelscope`), or unset {MODELSCOPE_SWITCH} to use the Hugging Face "
                "cache, or give the model's local directory",
            )
        ) from None
    try:
        found = snapshot_download(name, local_files_only=True)
    except Exception:  # not in the cache
        found = None
    if found is None or not (Path(found) / "config.json").is_file():
        cache = os.environ.get("MODELSCOPE_CACHE", "~/.cache/modelscope/hub")
        raise ConfigError(
            ConfigIssue(
                key,
                f"{MODELSCOPE_SWITCH} is set and {name} is not in ModelScope's cache ({cache}); "
                f"nothing is downloaded at run time: download it first (`modelscope download "
                f"--model {name}`), or give the model's local directory",
            )
        )
    return str(Path(found).resolve())


def same_directory(a: str, b: str) -> bool:
    """Whether the paths `a` and `b` name one directory (relative to the working directory)."""
    return Path(a).expanduser().absolute().resolve() == Path(b).expanduser().absolute().resolve()


def tiny_model_to_build(pretrain: str, build_at: str | None, key: str) -> bool:
    """Whether the app builds its tiny model: `build_at` (`<app>.build_tiny_model`, named by
    `key`) is set and `pretrain` names that directory. A directory there that this stack did not
    build (no tiny-model marker) is a `ConfigError`: it is never overwritten."""
    from rl_rollout.tiny_model import TINY_MODEL_MARKER

    if build_at is None or not same_directory(pretrain, build_at):
        return False
    path = Path(build_at).expanduser()
    if path.exists() and not (path / TINY_MODEL_MARKER).is_file():
        raise ConfigError(
            ConfigIssue(
                key,
                f"{build_at} exists and is not a tiny model built here (no {TINY_MODEL_MARKER}); "
                f"it is never overwritten: to train the model in it, set {key}: null; to build "
                "a tiny model, point both pretrain and this key at another directory",
            )
        )
    return True


def unused_tiny_model_note(pretrain: str, build_at: str | None, key: str) -> str | None:
    """The line saying `<app>.build_tiny_model` is not used because `pretrain` names another
    model (None when it is used, or unset)."""
    if build_at is None or same_directory(pretrain, build_at):
        return None
    return (
        f"{key}={build_at} is not built: pretrain names another model ({pretrain}), which is loaded"
    )


def policy_model(
    pretrain: str,
    *,
    build_at: str | None = None,
    tiny_model: Any = None,
    key: str = "build_tiny_model",
    system_envs: Mapping[str, Any] | None = None,
) -> str:
    """The policy model a run loads: the tiny model built (or reused) at `pretrain` when
    `tiny_model_to_build`, else `resolve_model(pretrain)`. `tiny_model`: a dataclass of
    `rl_rollout.tiny_model.build_tiny_model`'s options."""
    if tiny_model_to_build(pretrain, build_at, key):
        from dataclasses import asdict

        from rl_rollout.tiny_model import build_tiny_model

        return str(Path(build_tiny_model(pretrain, **asdict(tiny_model))).resolve())
    return resolve_model(pretrain, key="pretrain", system_envs=system_envs)
