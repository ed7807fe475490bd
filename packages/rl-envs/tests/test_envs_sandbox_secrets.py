"""Every secret the runtime knows is hidden from calls: a checkpoint key named only by the
config (``checkpoint_config.key_file``, which the runtime passes on through
``RL_SANDBOX_HIDE``), and tracker credentials (the non-root mode is run in
``test_envs_sandbox_escapes.py`` through ``sandbox_scenario.py``)."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from rl_envs.sandbox import SandboxLimits, SandboxPool
from rl_envs.sandbox.credentials import HIDE_VARIABLE, hide_from_calls, secret_paths

pytestmark = pytest.mark.xdist_group("dist")  # starts sandbox worker processes


@pytest.fixture
def keys_dir():
    """Outside /tmp, which calls see as their own private tmpfs."""
    path = Path("/var/tmp") / f"rl_sandbox_keys_{uuid.uuid4().hex}"
    path.mkdir(mode=0o755)
    yield path
    shutil.rmtree(path)


def test_a_key_named_only_by_the_config_is_empty_in_calls(keys_dir, monkeypatch):
    key = keys_dir / "run.key"
    secret = uuid.uuid4().hex
    key.write_text(secret)
    key.chmod(0o644)  # readable by a slot uid too: only the mount hides it
    monkeypatch.delenv(HIDE_VARIABLE, raising=False)
    env = dict(os.environ)
    hide_from_calls(key, env)
    monkeypatch.setenv(HIDE_VARIABLE, env[HIDE_VARIABLE])
    assert str(key) in secret_paths()
    with SandboxPool(1, limits=SandboxLimits(timeout_s=10, allow_weak_isolation=True)) as pool:
        if pool.isolation["credentials"] != "hidden":
            pytest.skip(f"no private mounts here: {pool.isolation}")
        result = pool.run_python(f"print(repr(open({str(key)!r}).read()))")
    assert result.ok, result
    assert secret not in result.stdout and result.stdout == "''\n"


def test_tracker_credentials_are_listed(tmp_path):
    (tmp_path / ".config" / "wandb").mkdir(parents=True)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai password x\n")
    found = secret_paths({"HOME": str(tmp_path), "NETRC": str(netrc)})
    assert str(tmp_path / ".config" / "wandb") in found and str(netrc) in found


def test_hide_from_calls_adds_each_path_once(tmp_path):
    env: dict[str, str] = {}
    hide_from_calls(tmp_path / "a", env)
    hide_from_calls(tmp_path / "a", env)
    hide_from_calls(tmp_path / "b", env)
    assert env[HIDE_VARIABLE].split(os.pathsep) == [str(tmp_path / "a"), str(tmp_path / "b")]
