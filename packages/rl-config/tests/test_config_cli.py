"""The rl-config command: exit codes and output, run as a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

RL_CONFIG = Path(sys.executable).parent / "rl-config"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RL_CONFIG), *args], capture_output=True, text=True, timeout=120)


def test_config_cli_check_ok_prints_resolved(seed_yaml: Path) -> None:
    result = run("check", str(seed_yaml), "seed=7", "tracker_kwargs.api_key=topsecret")
    assert result.returncode == 0, result.stderr
    data = yaml.safe_load(result.stdout)
    assert data["seed"] == 7
    assert data["actor_train"]["device_mapping"] == [0, 1]
    assert data["tracker_kwargs"]["api_key"] == "***REDACTED***"
    assert "topsecret" not in result.stdout
    assert "is valid" in result.stderr


def test_config_cli_check_errors_exit_1(seed_yaml: Path) -> None:
    result = run("check", str(seed_yaml), "actor_train.training_args.learning_rat=1e-5")
    assert result.returncode == 1
    assert "actor_train.training_args.learning_rat" in result.stderr
    assert "did you mean 'learning_rate'" in result.stderr
    assert result.stdout == ""
    seed_yaml.write_text(seed_yaml.read_text().replace("deepspeed_train", "megatron_train"))
    result = run("check", str(seed_yaml))
    assert result.returncode == 1
    assert "Megatron-LM is not implemented" in result.stderr
    assert f"rl-config convert {seed_yaml} --strategy fsdp2|deepspeed -o OUT" in result.stderr


def test_config_cli_explain() -> None:
    result = run("explain", "train_env_manager.num_groups_partition")
    assert result.returncode == 0
    assert "sum to num_env_groups" in result.stdout
    result = run("explain", "train_env_manager.num_group_partition")
    assert result.returncode == 1
    assert "did you mean 'num_groups_partition'" in result.stderr


def test_config_cli_check_an_app_config(seed_yaml: Path) -> None:
    """An app's YAML holds the app's own section (apps/agentic's `agentic_app:`): the error says
    whose section it is and how to check the file; `--app-section` leaves it out."""
    seed_yaml.write_text(seed_yaml.read_text() + "\nagentic_app:\n  tiny_model: true\n")
    result = run("check", "-q", str(seed_yaml))
    assert result.returncode == 1
    assert "agentic_app: unknown key; 'agentic_app' is the options section of apps/agentic" in (
        result.stderr
    )
    assert "rl-config check FILE --app-section agentic_app" in result.stderr
    assert "uv run apps/agentic --config FILE --dry-run" in result.stderr
    result = run("check", "-q", str(seed_yaml), "--app-section", "agentic_app")
    assert result.returncode == 0, result.stderr
    assert "is valid" in result.stderr
    result = run("check", "-q", str(seed_yaml), "--app-section", "agentic_app", "seed=x")
    assert result.returncode == 1 and "seed: expected an integer" in result.stderr
