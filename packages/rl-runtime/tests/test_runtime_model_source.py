"""rl_runtime.run.model_source: a model is a local directory, a hub id in a local cache, or the tiny
model an app builds where it says so; anything else is an error naming the key, and nothing is
built, downloaded or overwritten in its place."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from rl_config.errors import ConfigError
from rl_runtime.run.model_source import policy_model, resolve_model, tiny_model_to_build


def check_policy_model(pretrain: str, *, build_at: str | None = None,
                       key: str = "build_tiny_model") -> list:  # fmt: skip
    """What `policy_model` would refuse, without building anything: the issues (empty: fine)."""
    try:
        if not tiny_model_to_build(pretrain, build_at, key):
            resolve_model(pretrain, key="pretrain")
    except ConfigError as exc:
        return list(exc.issues)
    return []


def _model_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "tokenizer.json").write_text("{}")
    return path


def test_a_missing_local_path_is_an_error_and_nothing_is_created(tmp_path):
    missing = tmp_path / "missing" / "dir"
    with pytest.raises(ConfigError) as info:
        policy_model(str(missing), build_at="./output/tiny_model")  # the default's build path
    (issue,) = info.value.issues
    assert issue.path == "pretrain" and f"model directory {missing} does not exist" in issue.message
    assert not (tmp_path / "missing").exists()


def test_a_hub_id_not_in_the_cache_is_an_error_saying_what_to_do(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf

    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("USE_MODELSCOPE", raising=False)
    with pytest.raises(ConfigError) as info:
        resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    message = info.value.issues[0].message
    assert "Qwen/Qwen2.5-0.5B-Instruct is not a local directory" in message
    assert "hf download Qwen/Qwen2.5-0.5B-Instruct" in message and "USE_MODELSCOPE=1" in message


def test_a_hub_id_in_the_local_cache_resolves_to_its_snapshot(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf

    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = _model_dir(repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("USE_MODELSCOPE", raising=False)
    assert resolve_model("org/tiny") == str(snapshot.resolve())


def test_use_modelscope_without_the_package_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "modelscope", None)  # not importable
    monkeypatch.delenv("USE_MODELSCOPE", raising=False)
    with pytest.raises(ConfigError) as info:
        resolve_model("Qwen/Qwen2.5-0.5B-Instruct", system_envs={"USE_MODELSCOPE": "1"})
    message = info.value.issues[0].message
    assert "USE_MODELSCOPE is set" in message and "modelscope package is not installed" in message


def test_use_modelscope_resolves_through_its_snapshot_api_offline(tmp_path, monkeypatch):
    """ModelScope's cache layout (`$MODELSCOPE_CACHE/models/<org>/<name>`) read through its
    `snapshot_download(..., local_files_only=True)` (a stand-in module: the package is an
    optional extra); a model not in it is an error naming ModelScope's download command."""
    cache = tmp_path / "ms"
    model = _model_dir(cache / "models" / "org" / "tiny")
    calls = []

    def snapshot_download(model_id, local_files_only=False, **_):
        calls.append((model_id, local_files_only))
        found = cache / "models" / model_id
        if not found.is_dir():
            raise ValueError("not in the cache and local_files_only")
        return str(found)

    monkeypatch.setitem(
        sys.modules, "modelscope", types.SimpleNamespace(snapshot_download=snapshot_download)
    )
    monkeypatch.setenv("USE_MODELSCOPE", "1")
    assert resolve_model("org/tiny") == str(model.resolve())
    with pytest.raises(ConfigError, match="modelscope download --model org/other"):
        resolve_model("org/other")
    assert calls == [("org/tiny", True), ("org/other", True)]


def test_a_tiny_model_is_built_only_where_build_tiny_model_names_pretrain(tmp_path):
    build_at = str(tmp_path / "tiny")
    assert check_policy_model(build_at, build_at=build_at) == []  # will be built: fine
    other = tmp_path / "other"
    (issue,) = check_policy_model(str(other), build_at=build_at)
    assert issue.path == "pretrain" and not other.exists() and not Path(build_at).exists()


def test_a_directory_at_the_build_path_that_is_not_a_tiny_model_is_never_overwritten(tmp_path):
    mine = _model_dir(tmp_path / "mine")
    (mine / "model.safetensors").write_bytes(b"my weights")
    (issue,) = check_policy_model(str(mine), build_at=str(mine), key="rlvr_app.build_tiny_model")
    assert issue.path == "rlvr_app.build_tiny_model" and "never overwritten" in issue.message
    assert (mine / "model.safetensors").read_bytes() == b"my weights"


def test_build_tiny_model_true_is_refused_with_what_it_takes():
    from rl_runtime.cli.app_options import AppRunOptions

    with pytest.raises(ValueError, match="expected the directory to build a tiny model in"):
        AppRunOptions.from_mapping({"build_tiny_model": True})
    assert AppRunOptions.from_mapping({"build_tiny_model": False}).build_tiny_model is None
