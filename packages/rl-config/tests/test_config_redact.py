"""Secrets never reach the resolved-config dump."""

from __future__ import annotations

import pytest

from rl_config import ExperimentConfig, dump_resolved, load_config, redact
from rl_config.redact import REDACTED, is_secret_key


@pytest.mark.parametrize(
    "key",
    [
        "api_key",
        "WANDB_API_KEY",
        "HF_TOKEN",
        "access_token",
        "password",
        "db_passwd",
        "clientSecret",
        "OPENAI_API_KEY",
        "aws_secret_access_key",
        "private_key",
        "Authorization",
    ],
)
def test_config_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "max_tokens_per_step",
        "stop_token_ids",
        "max_new_tokens",
        "pad_token_id",
        "tokenizer",
        "project",
        "key_order",
        "monkey",
        "author",
    ],
)
def test_config_not_secret_keys(key: str) -> None:
    assert not is_secret_key(key)


def test_config_redact_nested_and_urls() -> None:
    data = {
        "tracker_kwargs": {"api_key": "abc123", "project": "p", "empty_token": None},
        "system_envs": {"HF_TOKEN": "hf_xyz", "USE_MODELSCOPE": "1"},
        "items": [{"password": "pw"}],
        "endpoint": "https://user:s3cret@host/x",
    }
    out = redact(data)
    assert out["tracker_kwargs"] == {"api_key": REDACTED, "project": "p", "empty_token": None}
    assert out["system_envs"] == {"HF_TOKEN": REDACTED, "USE_MODELSCOPE": "1"}
    assert out["items"] == [{"password": REDACTED}]
    assert out["endpoint"] == f"https://user:{REDACTED}@host/x"
    assert data["tracker_kwargs"]["api_key"] == "abc123"  # input untouched


def test_config_dump_resolved(tmp_path) -> None:
    cfg = ExperimentConfig.model_validate(
        {
            "pretrain": "m",
            "track_with": "wandb",
            "tracker_kwargs": {"api_key": "sk-live-123", "project": "p"},
            "system_envs": {"WANDB_API_KEY": "sk-live-456", "OMP_NUM_THREADS": 1},
            "actor_train": {"system_envs": {"HF_TOKEN": "hf_secret"}},
        }
    )
    path = dump_resolved(cfg, tmp_path / "out")
    text = path.read_text()
    for secret in ("sk-live-123", "sk-live-456", "hf_secret"):
        assert secret not in text
    assert text.count(REDACTED) == 3
    assert "OMP_NUM_THREADS: '1'" in text
    reloaded = load_config(path)
    assert reloaded.tracker_kwargs == {"api_key": REDACTED, "project": "p"}
    assert reloaded.actor_train == cfg.actor_train.model_copy(
        update={"system_envs": {"HF_TOKEN": REDACTED}}
    )
    assert [p.name for p in path.parent.iterdir()] == ["resolved_config.yaml"]  # no temp left
