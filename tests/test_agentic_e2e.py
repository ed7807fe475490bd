"""End to end: apps/agentic on the CPU with a tiny model (HF engine), through Ray and in-process.

Asserts what a run must do: finite losses, actor weights that change, engines holding exactly the
trainer's weights after every versioned sync, metrics logged, and a run stopped after step k and
resumed giving the same step k+1 metrics as an uninterrupted run.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.app_loading import app_main, assert_planned, run_app, run_in_process

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "agentic"
CONFIG = APP / "configs" / "cpu_default.yaml"


def _overrides(out: Path, **extra: object) -> list[str]:
    base = {
        "output_dir": str(out),
        "logging_dir": str(out / "logs"),
        "render_save_dir": str(out / "render"),
        "checkpoint_config.output_dir": str(out / "ckpt"),
        "pretrain": str(out.parent / "tiny_model"),
        "agentic_app.build_tiny_model": str(out.parent / "tiny_model"),
        "track_with": "stdout",
        "max_steps": 2,
        "eval_steps": 2,
        "save_steps": 1000,
        "rollout_batch_size": 8,
        "train_env_manager.num_env_groups": 2,
        "train_env_manager.group_size": 4,
        "train_env_manager.num_groups_partition": "[2]",
        "val_env_manager.num_env_groups": 4,
        "val_env_manager.num_groups_partition": "[4]",
        "actor_train.training_args.per_device_train_batch_size": 4,
        "actor_train.training_args.gradient_accumulation_steps": 2,
        "agentic_app.warmup.steps": 2,
        "agentic_app.warmup.episodes": 8,
        "agentic_app.warmup.batch_size": 8,
        "agentic_app.eval_before_training": "false",
        "agentic_app.check_sync_weights": "true",
        "agentic_app.export_hf": "true",
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _run_with_stdout(out: Path, *args: str, **extra: object) -> tuple[list[dict], str]:
    """The run's step rows and stdout: on Ray a subprocess, as a user runs it; with `--no-ray`
    the same command line in this process."""
    argv = ["--config", str(CONFIG), *args, *_overrides(out, **extra)]
    proc = run_app("agentic", argv, out.parent, as_subprocess="--no-ray" not in args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["step"] > 0], proc.stdout


def _run(out: Path, *args: str, **extra: object) -> list[dict]:
    return _run_with_stdout(out, *args, **extra)[0]


def _check_run(rows: list[dict], out: Path) -> None:
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"])
        assert r["sync/max_abs_diff"] == 0.0  # engine == trainer after every sync
        assert r["sync/weight_version"] == r["step"] + 1  # warm-up sync was version 1
        assert 0.0 <= r["env/success_rate"] <= 1.0
        assert r["timing/rollout"] > 0 and r["rollout/num_trajectories"] == 8
        assert r["failures/episodes"] == 0.0 and r["failures/fraction"] == 0.0  # counted
    assert "val/success_rate" in steps[-1]
    assert (out / "curves.png").stat().st_size > 0
    # exported HF weights differ from the initial tiny model: the actor was trained
    from safetensors.torch import load_file

    before = load_file(str(out.parent / "tiny_model" / "model.safetensors"))
    after = load_file(str(out / "hf_model" / "model.safetensors"))
    changed = [k for k in before if k in after and not before[k].equal(after[k])]
    assert changed, "no parameter changed during training"


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_agentic_cpu_ray_hf_engine(tmp_path):
    out = tmp_path / "ray_run"
    rows = _run(out, "agentic_app.num_cpus=2")
    _check_run(rows, out)


@pytest.mark.slow  # in-process (--no-ray): not in the "ray" group, it may run beside a Ray test
def test_agentic_resume_matches_uninterrupted(tmp_path):
    common = {"max_steps": 3, "save_steps": 2, "agentic_app.check_sync_weights": "false",
              "agentic_app.eval_before_training": "true"}  # fmt: skip
    full = _run(tmp_path / "full", "--no-ray", **common)
    _run(tmp_path / "part", "--no-ray", **{**common, "max_steps": 2})
    resumed, stdout = _run_with_stdout(
        tmp_path / "part", "--no-ray", **{**common, "resume_from_checkpoint": "true"}
    )
    lines = [line for line in stdout.splitlines() if not line.startswith("note: ")]
    # the first line after the preflight's notes names the checkpoint, its step and weight version (warm-up sync = 1)
    assert lines[0].startswith("resuming from checkpoint ") and "step-000002" in lines[0]
    assert lines[0].endswith("at step 2 (weight version 3)")
    assert any(x.startswith("warning: max_steps changed since checkpoint") for x in lines)
    step3_full = next(r for r in full if r["step"] == 3 and "train/loss" in r)
    step3_resumed = next(r for r in resumed if r["step"] == 3 and "train/loss" in r)
    for key in (
        "env/success_rate",
        "env/episode_reward",
        "rollout/response_tokens",
        "train/loss",
        "train/grad_norm",
        "sync/weight_version",
    ):
        assert step3_resumed[key] == pytest.approx(step3_full[key], rel=1e-5, abs=1e-6), key
    summaries = [json.loads((tmp_path / d / "summary.json").read_text()) for d in ("full", "part")]
    assert summaries[1]["eval_before"]  # the evaluation before RL comes from the checkpoint
    for part in ("eval_before", "eval_after"):
        resumed_eval, full_eval = ({k: v for k, v in summary[part].items() if not k.startswith("timing/")}
                                   for summary in summaries)  # fmt: skip
        assert resumed_eval == pytest.approx(full_eval, rel=1e-5), part
    # the run's totals, not the resumed part's (the checkpoint carries them)
    throughput = [summary["throughput"] for summary in summaries]
    assert throughput[1]["samples_trained"] == throughput[0]["samples_trained"] > 0
    assert throughput[1]["scope"] == "run"


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.xdist_group("ray")
def test_agentic_cpu_ray_vllm_engine(tmp_path):
    pytest.importorskip("vllm")
    out = tmp_path / "vllm_run"
    rows = _run(
        out,
        "agentic_app.num_cpus=2",
        **{
            "actor_infer.strategy_args.strategy_name": "vllm",
            "actor_infer.strategy_args.strategy_config": "{gpu_memory_utilization: 0.1}",
        },
    )
    _check_run(rows, out)


def test_roll_sokoban_config_validates_and_dry_runs():
    cfg = APP / "configs" / "examples" / "agentic_val_sokoban.yaml"
    proc = subprocess.run(
        [sys.executable, str(APP), "--config", str(cfg), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_planned(proc.returncode, proc.stderr)  # a hub model, 3 devices: not on this host
    assert "actor_train  workers=2 devices=[0, 1]" in proc.stdout
    assert "actor_infer  workers=1 devices=[2]" in proc.stdout
    assert "deepspeed_train" in proc.stdout and "strategy=vllm" in proc.stdout


ROLL = ROOT / "packages" / "rl-config" / "tests" / "data" / "roll"
# ROLL agentic examples without Megatron that need what this stack lacks: refused by name
ROLL_REFUSED = {
    "head/examples/agentic_demo/agent_rollout_rock_swe.yaml": (
        "custom_envs.swebench_native_verified.env_type: unknown env 'rock_tb_native_env'"
    ),
    "head/examples/qwen2.5-7B-agentic_megatron/agentic_val_webshop_amd.yaml": (
        "custom_envs.WebShopEnv.max_env_step_concurrent: 5 is not supported"
    ),
    "v0.2.1/examples/qwen2.5-7B-agentic_megatron/agentic_val_webshop_amd.yaml": (
        "custom_envs.SimpleSokoban.max_steps=10 disagrees with "
        "custom_envs.SimpleSokoban.env_config.max_steps=20"
    ),
}


def _roll_agentic() -> list[str]:
    import csv

    with (ROLL / "MANIFEST.tsv").open() as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [f"{r['version']}/{r['path']}" for r in rows
            if r["kind"] == "agentic" and r["strategy"] != "megatron"]  # fmt: skip


@pytest.mark.parametrize("name", _roll_agentic())
def test_roll_agentic_examples_without_megatron_dry_run_through_the_app(name, capsys):
    """`apps/agentic --config <ROLL example> --dry-run`: ROLL's agent_system_template and
    agent_template (examples/config/traj_envs.yaml) become the envs' prompts; an env this
    stack does not have, or a key it lacks, is one line naming the key."""
    code = app_main("agentic")(["--config", str(ROLL / name), "--dry-run"])
    out, err = capsys.readouterr()
    if name in ROLL_REFUSED:
        assert code == 1 and ROLL_REFUSED[name] in err, err
        return
    assert_planned(code, err)
    assert "'turn_template': 'Turn {turn_idx}:\\n'" in out, out  # ROLL's agent_template
    assert "'system_prompt': \"You're a helpful assistant." in out


def test_roll_webshop_example_with_reward_clip_dry_runs_on_sokoban(tmp_path, capsys):
    """ROLL's agentic_val_webshop_amd (grpo, mean_std, reward_clip: 20) with its WebShop env
    swapped for SimpleSokoban (this stack has no WebShop) and the env-step rate limit dropped:
    reward_clip, refused in the agentic pipeline before, reaches the advantage config."""
    import shutil

    examples = ROLL / "head" / "examples"
    for part in ("config", "qwen2.5-7B-agentic_megatron"):
        shutil.copytree(examples / part, tmp_path / part)
    envs = tmp_path / "config" / "traj_envs.yaml"
    envs.write_text(
        "".join(x for x in envs.read_text().splitlines(True) if "max_env_step_concurrent" not in x)
    )
    cfg = tmp_path / "qwen2.5-7B-agentic_megatron" / "agentic_val_webshop_amd.yaml"
    text = cfg.read_text()
    assert "reward_clip: 20" in text and 'adv_estimator: "grpo"' in text
    cfg.write_text(text.replace("WebShopEnv", "SimpleSokoban"))
    code = app_main("agentic")(["--config", str(cfg), "--dry-run"])
    out, err = capsys.readouterr()
    assert_planned(code, err)
    assert "reward_clip=20.0" in out


def test_all_seven_roll_agentic_examples_are_swept():
    names = _roll_agentic()
    assert len(names) == 7 and set(names) >= set(ROLL_REFUSED)


def test_a_solver_warm_up_on_envs_the_solver_cannot_play_is_refused_before_the_run(
    tmp_path, capsys
):
    """countdown with `agentic_app.warmup.steps` > 0 started Ray, the workers and the warm-up,
    then died with 'the solver produced no successful demonstration'."""
    countdown = ["+custom_envs.C.env_type=countdown", "train_env_manager.tags=[C]",
                 "val_env_manager.tags=[C]", f"output_dir={tmp_path}/out"]  # fmt: skip
    assert app_main("agentic")(countdown) == 1
    err = capsys.readouterr().err
    assert "config error: agentic_app.warmup.steps=100: the warm-up plays" in err
    assert "tag 'C' (env type 'countdown' has no solver)" in err
    assert not (tmp_path / "out").exists()
    assert app_main("agentic")([*countdown, "agentic_app.warmup.steps=0", "--dry-run"]) == 0
    assert "warm-up" not in capsys.readouterr().out


def test_checking_the_replay_engines_weights_is_refused_before_the_run(tmp_path, capsys):
    """The replay engine holds no weights: `check_sync_weights` with it failed at the first sync
    ("engine parameters not in the trainer: []"), after the workers and the warm-up."""
    replay = ["actor_infer.strategy_args.strategy_name=replay",
              f"+actor_infer.strategy_args.strategy_config.generations={tmp_path}/generations",
              f"output_dir={tmp_path}/out"]  # fmt: skip
    assert app_main("agentic")([*replay, "agentic_app.check_sync_weights=true"]) == 1
    err = capsys.readouterr().err
    assert "config error: agentic_app.check_sync_weights=true: actor_infer's replay engine" in err
    assert not (tmp_path / "out").exists()
    # off by default: planned; the recorded generations this host lacks are named before the run
    assert app_main("agentic")([*replay, "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "check_sync_weights" not in err
    assert f"generations: generations directory {tmp_path}/generations does not exist" in err


def test_model_rewards_place_their_role_and_rollout_only_refuses_them(tmp_path, capsys):
    """A reward model scoring episodes at their end gets its role (devices from its
    device_mapping); --rollout-only, whose dumps would carry the envs' rewards alone, refuses it
    by name before anything starts."""
    rm = ["num_gpus_per_node=2", "rewards.rm.reward_fn=reward_model", "rewards.rm.device_mapping=[1]",
          f"rewards.rm.model_args.model_name_or_path={tmp_path}", f"output_dir={tmp_path}/out"]  # fmt: skip
    assert app_main("agentic")([*rm, "--dry-run"]) in (0, 1)  # (1: the path is no model here)
    out = capsys.readouterr().out
    assert "reward_rm    workers=1 devices=[1]" in out and "reward='reward_model'" in out
    assert app_main("agentic")([*rm, "--rollout-only"]) == 1
    err = capsys.readouterr().err
    assert "config error: rewards.rm: --rollout-only dumps episodes with the envs' rewards" in err
    assert not (tmp_path / "out").exists()


def test_bad_override_names_the_key():
    proc = subprocess.run(
        [sys.executable, str(APP), "--dry-run", "actor_train.training_args.learning_rat=1e-5"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    assert "learning_rat" in proc.stderr and "learning_rate" in proc.stderr


def test_missing_optional_package_fails_before_anything_starts(tmp_path):
    """track_with: wandb without wandb installed: a config error naming the key and the install
    command, before Ray, the tracker or any worker starts (it used to fail 30 s in, in Ray)."""
    import importlib.util

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    proc = subprocess.run(
        [sys.executable, str(APP), "track_with=wandb", f"output_dir={tmp_path / 'out'}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "track_with" in proc.stderr and "install it with" in proc.stderr
    assert not (tmp_path / "out" / "checkpoints").exists()
    assert "ray" not in proc.stdout.lower()


@pytest.mark.slow
def test_sokoban_steps_through_the_pipeline(tmp_path):
    """A few Sokoban steps (warm-up on solver demonstrations, RL, validation) in-process."""
    import yaml

    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["custom_envs"] = {
        "Sokoban": {
            "env_type": "sokoban",
            "max_steps": 4,
            "env_config": {
                "dim_room": [5, 5],
                "num_boxes": 1,
                "search_depth": 4,
                "layout_split": "train",
                "format_penalty": -0.1,
                "system_prompt": "You are a game player.",
                "env_instruction": "Sokoban: push the box X onto O. Answer like <answer>Up</answer>.",
                "turn_template": "Turn {turn_idx}, {actions_left} left:\n{observation}\n",
            },
        }
    }
    cfg["custom_envs"]["SokobanVal"] = {
        **cfg["custom_envs"]["Sokoban"],
        "env_config": {**cfg["custom_envs"]["Sokoban"]["env_config"], "layout_split": "val"},
    }
    cfg["train_env_manager"]["tags"] = ["Sokoban"]
    cfg["val_env_manager"]["tags"] = ["SokobanVal"]
    config = tmp_path / "sokoban.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "sokoban_run"
    argv = ["--config", str(config), "--no-ray"]
    argv += _overrides(out, **{"agentic_app.eval_before_training": "true"})
    proc = run_in_process("agentic", argv, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(math.isfinite(r["train/loss"]) for r in steps)
    assert all(r["rollout/num_trajectories"] == 8 for r in steps)
    assert "val/SokobanVal/success_rate" in steps[-1]
    assert any("warmup/actor/loss" in r for r in rows)
    assert "step 2/2 |" in proc.stdout  # the per-step line (stdout is not a terminal)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["baselines"] == {}  # the blind baselines are FrozenLake's
    assert set(summary["eval_before"]) >= {"val/success_rate", "val/num_episodes"}


ROLL_LORA = "head/examples/qwen2.5-0.5B-agentic/agentic_val_sokoban_lora.yaml"


def _roll_lora_overrides(out: Path) -> list[str]:
    """ROLL's LoRA example on one CPU: its sizes shrunk, the HF engine for vLLM, float32, a
    tiny model; REINFORCE without reward normalisation or whitening (the tiny model fails every
    episode alike, so normalised advantages would be 0) and a KL loss, whose reference is the
    actor's base model."""
    sizes = {
        "pretrain": str(out.parent / "tiny_model"),
        "num_gpus_per_node": 1,
        **{f"{r}.device_mapping": "[0]" for r in ("actor_train", "actor_infer", "reference")},
        **{f"{r}.model_args.dtype": "fp32" for r in ("actor_train", "actor_infer", "reference")},
        "actor_infer.strategy_args.strategy_name": "hf_infer",
        "actor_infer.strategy_args.strategy_config": "{}",
        "max_steps": 2,
        "eval_steps": 2,
        "rollout_batch_size": 8,
        "sequence_length": 1024,
        "train_env_manager.num_env_groups": 2,
        "train_env_manager.group_size": 4,
        "train_env_manager.num_groups_partition": "[2]",
        "val_env_manager.num_env_groups": 4,
        "val_env_manager.num_groups_partition": "[1,1,1,1]",
        "actor_train.training_args.per_device_train_batch_size": 4,
        "actor_train.training_args.gradient_accumulation_steps": 2,
        "adv_estimator": "reinforce",
        "whiten_advantages": "false",
        "reward_normalization.method": "identity",
        "use_kl_loss": "true",
        "kl_loss_coef": 0.1,
        "output_dir": str(out),
        "logging_dir": str(out / "logs"),
        "render_save_dir": str(out / "render"),
        "checkpoint_config.output_dir": str(out / "ckpt"),
        "track_with": "stdout",
        "tracker_kwargs": "{}",
        "agentic_app.check_sync_weights": "true",
        "agentic_app.export_hf": "true",
    }
    return [f"{k}={v}" for k, v in sizes.items()]


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_roll_lora_example_converts_dry_runs_and_trains_lora_on_the_cpu(tmp_path):
    """ROLL's agentic_val_sokoban_lora (Megatron, LoRA rank 32 on all linear layers) converted
    to FSDP2, 2 steps on the CPU through Ray: only the adapter trains (the exported merged model
    moved, every sync carried the adapter only and left the engine holding the trainer's merged
    weights), and the KL loss's reference is the actor with its adapter disabled (no reference
    worker)."""
    from safetensors.torch import load_file

    from rl_config.convert import convert_file, dump
    from rl_rollout.tiny_model import build_tiny_model

    build_tiny_model(tmp_path / "tiny_model")
    config = tmp_path / "lora.yaml"
    config.write_text(dump(convert_file(ROLL / ROLL_LORA, "fsdp2"), str(ROLL / ROLL_LORA), "fsdp2"))
    out = tmp_path / "run"
    cmd = [sys.executable, str(APP), "--config", str(config), *_roll_lora_overrides(out)]
    dry = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stderr
    assert "lora=LoraSettings(rank=32" in dry.stdout and "reference_from_actor: True" in dry.stdout
    assert "  reference  " not in dry.stdout  # no reference worker
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    before = load_file(str(tmp_path / "tiny_model" / "model.safetensors"))
    full_bytes = sum(t.numel() * t.element_size() for t in before.values())
    for r in steps:
        assert math.isfinite(r["train/loss"]) and r["train/grad_norm"] > 0
        assert r["sync/max_abs_diff"] == 0.0  # the engine merged the adapter as the trainer
        assert 0 < r["sync/bytes"] < full_bytes / 2  # the adapter only
    after = load_file(str(out / "hf_model" / "model.safetensors"))
    assert after.keys() == before.keys()  # the merged model under the base names
    assert any(not before[k].equal(after[k]) for k in before)
    assert all(before[k].equal(after[k]) for k in before if "norm" in k or "embed" in k)
