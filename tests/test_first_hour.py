"""What a new user meets first, caught by `--dry-run` and by a run before anything starts: a
model that is not there (a path, a hub id with no network), a missing data file, devices this
host does not have. Each was silent before (a random tiny model built at the path and trained;
the rest failed after Ray started, at the end of a long traceback)."""

from __future__ import annotations

import pytest

from tests.app_loading import app_main


def _rlvr(tmp_path, *args: str) -> list[str]:
    out = tmp_path / "out"
    return [*args, f"output_dir={out}", f"logging_dir={out / 'logs'}",
            f"checkpoint_config.output_dir={out / 'ckpt'}",
            f"rlvr_app.arith_data.out_dir={tmp_path / 'data'}",
            f"actor_train.data_args.file_name={tmp_path / 'data' / 'train.parquet'}",
            f"actor_train.data_args.eval_file_name={tmp_path / 'data' / 'test.parquet'}"]  # fmt: skip


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    import huggingface_hub.constants as hf

    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("USE_MODELSCOPE", "RL_DEVICE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("flag", ["--dry-run", "--no-ray"])
def test_a_missing_model_path_is_an_error_before_anything_is_built_or_started(
    tmp_path, capsys, flag
):
    import ray

    missing = tmp_path / "missing" / "dir"
    assert app_main("rlvr")([flag, *_rlvr(tmp_path, f"pretrain={missing}")]) == 1
    err = capsys.readouterr().err
    assert f"pretrain: model directory {missing} does not exist" in err
    assert not (tmp_path / "missing").exists() and not (tmp_path / "out").exists()
    assert not (tmp_path / "data").exists()  # the generated data is not written either
    assert not ray.is_initialized()


def test_a_hub_id_not_downloaded_is_an_error_saying_what_to_do(tmp_path, capsys):
    args = _rlvr(tmp_path, "pretrain=Qwen/Qwen2.5-0.5B-Instruct")
    assert app_main("rlvr")(["--dry-run", *args]) == 1
    err = capsys.readouterr().err
    assert "pretrain: Qwen/Qwen2.5-0.5B-Instruct is not a local directory" in err
    assert "hf download Qwen/Qwen2.5-0.5B-Instruct" in err
    assert not (tmp_path / "Qwen").exists() and not (tmp_path / "out").exists()


def test_a_missing_data_file_is_caught_by_the_dry_run(tmp_path, capsys):
    from rl_rollout.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "model")
    args = [*_rlvr(tmp_path, f"pretrain={model}"), "rlvr_app.arith_data.generate=false"]
    assert app_main("rlvr")(["--dry-run", *args]) == 1
    err = capsys.readouterr().err
    assert "actor_train.data_args.file_name: dataset file not found: " in err
    assert "actor_train.data_args.eval_file_name: dataset file not found: " in err


def test_a_data_file_whose_rows_do_not_parse_is_caught_by_the_dry_run(tmp_path, capsys):
    from rl_rollout.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "model")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"question": "1+1?"}\n')
    (tmp_path / "data" / "test.jsonl").write_text("not json\n")
    args = [*_rlvr(tmp_path, f"pretrain={model}"), "rlvr_app.arith_data.generate=false",
            f"actor_train.data_args.file_name={tmp_path / 'data' / 'train.jsonl'}",
            f"actor_train.data_args.eval_file_name={tmp_path / 'data' / 'test.jsonl'}"]  # fmt: skip
    assert app_main("rlvr")(["--dry-run", *args]) == 1
    err = capsys.readouterr().err
    assert "actor_train.data_args.file_name: " in err and "train.jsonl: none of its first" in err
    assert (
        "actor_train.data_args.eval_file_name: " in err and "test.jsonl: none of its first" in err
    )


@pytest.mark.parametrize(
    ("setting", "key"),
    [("system_envs.RL_DEVICE=npu", "system_envs.RL_DEVICE"), ("env", "RL_DEVICE (environment)")],
)
def test_a_device_kind_this_host_lacks_is_named_by_the_dry_run(
    tmp_path, capsys, monkeypatch, setting, key
):
    """`RL_DEVICE` is the stack's device setting (verl's `trainer.device` maps to it): npu on a
    CPU host stops the dry run, naming the key (before: a traceback from device detection)."""
    overrides = [setting] if setting != "env" else []
    if setting == "env":
        monkeypatch.setenv("RL_DEVICE", "npu")
    assert app_main("rlvr")(["--dry-run", *_rlvr(tmp_path, *overrides)]) == 1
    err = capsys.readouterr().err
    assert f"{key}: " in err and "npu" in err and "this host has no" in err
    assert "Traceback" not in err


def test_more_devices_than_the_host_has_are_named_by_the_dry_run(tmp_path, capsys):
    """A placement of 8 devices: each a bundle of cpu_per_bundle CPUs, more than this host's
    Ray cluster will hold (num_cpus unset: the host's CPUs)."""
    import os

    n = (os.cpu_count() or 1) + 6
    args = _rlvr(tmp_path, f"num_gpus_per_node={n}", f"actor_train.device_mapping=list(range(0,{n}))",
                 f"actor_infer.device_mapping=list(range(0,{n}))",
                 f"reference.device_mapping=list(range(0,{n}))", "~rlvr_app.num_cpus",
                 f"rollout_batch_size={8 * n}",
                 "actor_train.training_args.per_device_train_batch_size=1")  # fmt: skip
    assert app_main("rlvr")(["--dry-run", *args]) == 1
    err = capsys.readouterr().err
    assert f"placement: CPU: the placement needs {n}" in err


def test_rl_config_check_deep_runs_the_same_preflight(tmp_path, capsys):
    """`rl-config check` passed a config whose model and data files are missing; `--deep` runs
    rl-runtime's preflight (found through an entry point: rl-config imports no rl-runtime)."""
    from pathlib import Path

    from rl_config.cli import main

    config = Path(__file__).resolve().parents[1] / "apps" / "rlvr" / "configs" / "cpu_default.yaml"
    missing = tmp_path / "missing"
    args = ["check", "-q", "--app-section", "rlvr_app", str(config), f"pretrain={missing}",
            "rlvr_app.arith_data.generate=false", *_rlvr(tmp_path)[3:]]  # fmt: skip
    assert main(args) == 0  # the shallow check: valid
    capsys.readouterr()
    assert main([*args, "--deep"]) == 1
    err = capsys.readouterr().err
    assert f"error: pretrain: model directory {missing} does not exist" in err
    assert "error: actor_train.data_args.file_name: dataset file not found" in err
    assert not missing.exists() and not (tmp_path / "out").exists()


def test_an_output_directory_that_cannot_be_written_is_named_by_the_dry_run(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    args = [*_rlvr(tmp_path), f"output_dir={blocker / 'out'}", f"logging_dir={blocker / 'logs'}"]
    assert app_main("rlvr")(["--dry-run", *args]) == 1
    err = capsys.readouterr().err
    assert f"output_dir: {blocker / 'out'}: {blocker} is not a directory" in err
    assert f"logging_dir: {blocker / 'logs'}: {blocker} is not a directory" in err


def test_apps_async_runs_the_same_preflight_before_writing_anything(tmp_path, capsys):
    missing = tmp_path / "missing"
    assert app_main("async")(_rlvr(tmp_path, f"pretrain={missing}")) == 1
    assert f"pretrain: model directory {missing} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "data").exists() and not (tmp_path / "out").exists()
