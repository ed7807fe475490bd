"""App command lines: ``--config FILE k=v --dry-run`` and ROLL's ``--config_path/--config_name``."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_config import ConfigError
from rl_config.cli_args import parse_app_args


def test_app_args_config_form(tmp_path: Path) -> None:
    args = parse_app_args(["--config", "exp.yaml", "seed=3", "a.b=1", "--dry-run"])
    assert args.config == Path("exp.yaml")
    assert args.overrides == ["seed=3", "a.b=1"]
    assert args.flags == frozenset({"dry_run"})
    plain = parse_app_args([], default_config=tmp_path / "d.yaml", flags={"no-ray": "x"})
    assert plain.config == tmp_path / "d.yaml" and plain.flags == frozenset()
    # overrides on both sides of a flag, in order
    mixed = parse_app_args(["seed=3", "--no-ray", "a.b=1"], flags={"no-ray": "x"})
    assert mixed.overrides == ["seed=3", "a.b=1"] and mixed.flags == frozenset({"no_ray"})


def test_app_args_roll_form_resolves_like_hydra(tmp_path: Path) -> None:
    # ROLL's scripts run from the repo root with DIR relative to examples/
    target = tmp_path / "examples" / "qwen2.5-7B-rlvr_megatron" / "rlvr_config.yaml"
    target.parent.mkdir(parents=True)
    target.write_text("pretrain: m\n")
    argv = ["--config_path", "qwen2.5-7B-rlvr_megatron", "--config_name", "rlvr_config"]
    args = parse_app_args(argv, cwd=tmp_path)
    assert args.config == target.resolve() and args.overrides == []
    # also with .yaml, an absolute DIR, and Hydra's dashed spelling plus overrides
    args = parse_app_args(
        ["--config-path", str(target.parent), "--config-name", "rlvr_config.yaml", "seed=1"],
        cwd=Path("/"),
    )
    assert args.config == target.resolve() and args.overrides == ["seed=1"]


def test_app_args_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="searched .*nope.yaml"):
        parse_app_args(["--config_path", "x", "--config_name", "nope"], cwd=tmp_path)
    with pytest.raises(ConfigError, match="needs --config_name too"):
        parse_app_args(["--config_path", "x"], cwd=tmp_path)
    with pytest.raises(ConfigError, match="either --config FILE or"):
        parse_app_args(["--config", "a.yaml", "--config_name", "b", "--config_path", "."])


def test_app_help_says_what_the_app_does(capsys):
    with pytest.raises(SystemExit) as stop:
        parse_app_args(["--help"], prog="apps/demo", description="`uv run apps/demo`\n\nTrains.")
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: apps/demo")
    assert "`uv run apps/demo`\n\nTrains." in out  # kept as written (RawDescriptionHelpFormatter)
