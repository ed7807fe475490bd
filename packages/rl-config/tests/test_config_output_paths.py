"""A user-given `output_dir` is the root of what a run writes: a config file's own absolute
directories (ROLL's `/data/...` checkpoints and TensorBoard logs) were honoured under it,
and the user's results went where they did not look."""

from __future__ import annotations

from rl_config import load_config

ROLL_LIKE = """\
pretrain: m
output_dir: /data/cpfs/roll/output
logging_dir: ${output_dir}/logs
checkpoint_config:
  type: file_system
  output_dir: /data/cpfs/roll/models/${exp_name}
exp_name: grpo
track_with: tensorboard
tracker_kwargs:
  log_dir: /data/oss/tensorboard/roll_exp/grpo
"""


def test_a_command_line_output_dir_rebases_the_files_absolute_directories(tmp_path):
    config = tmp_path / "roll.yaml"
    config.write_text(ROLL_LIKE)
    out = tmp_path / "mine"
    cfg = load_config(config, [f"output_dir={out}"])
    assert cfg.checkpoint_config.output_dir == str(out / "checkpoints")
    assert cfg.tracker_kwargs["log_dir"] == str(out / "tensorboard")
    assert cfg.logging_dir == f"{out}/logs"  # interpolated from output_dir: kept
    warnings = cfg.config_warnings()
    assert any(
        w.startswith(
            "checkpoint_config.output_dir: /data/cpfs/roll/models/grpo (from the config "
            f"file) is outside output_dir={out} given on the command line: written to "
            f"{out / 'checkpoints'} instead"
        )
        for w in warnings
    ), warnings
    assert any(w.startswith("tracker_kwargs.log_dir: /data/oss/tensorboard") for w in warnings)


def test_a_path_given_on_the_command_line_or_no_output_dir_given_keeps_the_files(tmp_path):
    config = tmp_path / "roll.yaml"
    config.write_text(ROLL_LIKE)
    out = tmp_path / "mine"
    cfg = load_config(config, [f"output_dir={out}", "checkpoint_config.output_dir=/ckpt/here"])
    assert cfg.checkpoint_config.output_dir == "/ckpt/here"
    assert cfg.tracker_kwargs["log_dir"] == str(out / "tensorboard")
    kept = load_config(config, ["exp_name=other"])
    assert kept.checkpoint_config.output_dir == "/data/cpfs/roll/models/other"
    assert kept.tracker_kwargs["log_dir"] == "/data/oss/tensorboard/roll_exp/grpo"
