"""`apps/dpo` end to end (its command line in this process, in-process workers; the dry runs in a
subprocess, as `uv run apps/dpo` runs): cached reference log-probs give the same run as
on-the-fly ones, every loss type runs through the app, a resumed run continues at the next batch
with the uninterrupted run's numbers, bad data is refused naming the rows."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.app_loading import run_in_process

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "dpo"
CONFIG = APP / "configs" / "cpu_default.yaml"
pytestmark = pytest.mark.xdist_group("dpo_e2e")


def _overrides(out: Path, **extra: object) -> list[str]:
    base = {
        "output_dir": str(out),
        "logging_dir": str(out / "logs"),
        "checkpoint_config.output_dir": str(out / "ckpt"),
        "pretrain": str(out.parent / "tiny_model"),
        "dpo_app.build_tiny_model": str(out.parent / "tiny_model"),
        "actor_train.data_args.file_name": str(out.parent / "data" / "train.jsonl"),
        "actor_train.data_args.eval_file_name": str(out.parent / "data" / "heldout.jsonl"),
        "track_with": "stdout",
        "max_steps": 2,
        "eval_steps": 2,
        "save_steps": 1000,
        "actor_train.training_args.per_device_train_batch_size": 2,
        "actor_train.training_args.gradient_accumulation_steps": 2,
        "dpo_app.arithmetic.train_rows": 24,
        "dpo_app.arithmetic.eval_rows": 8,
        "dpo_app.greedy_eval_prompts": 4,
        "dpo_app.eval_before_training": "false",
        "dpo_app.use_ray": "false",
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _run(out: Path, **extra: object) -> list[dict]:
    proc = run_in_process("dpo", ["--config", str(CONFIG), *_overrides(out, **extra)], out.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["step"] > 0 and "train/loss" in r]


@pytest.mark.slow
def test_cached_reference_equals_on_the_fly(tmp_path):
    cached = _run(tmp_path / "cached", precompute_ref_log_probs="true")
    fly = _run(tmp_path / "fly", precompute_ref_log_probs="false")
    assert [r["step"] for r in cached] == [1, 2]
    for a, b in zip(cached, fly, strict=True):
        for key in ("train/loss", "train/rewards/margins", "train/logps/chosen"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-7), key
    assert cached[-1]["val/rewards/accuracies"] == fly[-1]["val/rewards/accuracies"]
    assert 0.0 <= cached[-1]["val/greedy_correct"] <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["ipo", "simpo", "kto", "orpo"])
def test_every_loss_type_runs_through_the_app(tmp_path, loss):
    extra = {"label_smoothing": 0.1} if loss == "simpo" else {}
    rows = _run(tmp_path / loss, loss_type=loss, **extra)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"])
        assert r["train/optimizer_steps"] == 1.0  # accumulation over the full batch
    assert "val/rewards/accuracies" in rows[-1]


@pytest.mark.slow
def test_resume_continues_at_the_next_batch(tmp_path):
    # 10 pairs, 4 per step: an epoch is 2 steps (2 pairs skipped), so the resume starts epoch 1
    rows = {"dpo_app.arithmetic.train_rows": 10, "eval_steps": 0}
    full = _run(tmp_path / "full", max_steps=4, **rows)
    assert [r["train/epoch"] for r in full] == [0.0, 0.0, 1.0, 1.0]  # not step*4 // 10
    part = tmp_path / "part"
    _run(part, max_steps=2, save_steps=2, **rows)
    resumed = _run(part, max_steps=4, save_steps=2, resume_from_checkpoint="true", **rows)
    assert [r["step"] for r in resumed if r["step"] > 2] == [3, 4]
    by_step = {r["step"]: r for r in full}
    for r in resumed:
        if r["step"] > 2:
            assert r["train/loss"] == pytest.approx(by_step[r["step"]]["train/loss"], rel=1e-5)


def test_malformed_rows_fail_the_run_naming_them(tmp_path):
    data = tmp_path / "bad.jsonl"
    rows = [{"prompt": "a", "chosen": "1", "rejected": "2"}, {"prompt": "b", "chosen": "x"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    argv = [
        "--config", str(CONFIG),
        *_overrides(out, **{"actor_train.data_args.file_name": str(data),
                            "actor_train.data_args.eval_file_name": str(data),
                            "dpo_app.generate_arithmetic": "false"}),
    ]  # fmt: skip
    proc = run_in_process("dpo", argv, tmp_path)
    assert proc.returncode == 1 and not out.exists()  # the preflight's: before anything starts
    assert (
        f"actor_train.data_args.file_name: {data}: malformed row(s) among the first 8: "
        "row 1: missing 'rejected' (rejected_key)"
    ) in proc.stderr, proc.stderr


def test_a_missing_data_file_fails_the_run_naming_key_and_file(tmp_path):
    out = tmp_path / "run"
    argv = [
        "--config", str(CONFIG),
        *_overrides(out, **{"dpo_app.generate_arithmetic": "false"}),  # data/ was never written
    ]  # fmt: skip
    proc = run_in_process("dpo", argv, tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (  # the preflight's, before anything starts (nothing written under output_dir)
        "  - actor_train.data_args.file_name: dataset file not found: "
        f"{tmp_path / 'data' / 'train.jsonl'}"
    ) in proc.stderr
    assert proc.stderr.startswith("config error: invalid config (2 errors):")
    assert not out.exists()


def test_dry_run_prints_the_preference_plan():
    proc = subprocess.run(
        [sys.executable, str(APP), "--dry-run", "ipo=true"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "loss_type='ipo'" in proc.stdout and "reference='cached'" in proc.stdout
    bad = run_in_process("dpo", ["--dry-run", "ipo=true", "loss_type=simpo"], ROOT)
    assert bad.returncode == 1 and "ipo: true contradicts loss_type='simpo'" in bad.stderr


def test_generated_pairs_need_one_file_to_write_even_in_a_dry_run():
    """dpo_app.generate_arithmetic writes one train and one held-out file: a list of files is
    refused before anything is built, by a dry run too."""
    proc = run_in_process("dpo", ["--dry-run", "dpo_app.generate_arithmetic=true",
                                  "actor_train.data_args.file_name=[a.jsonl,b.jsonl]"], ROOT)  # fmt: skip
    assert proc.returncode == 1, proc.stdout
    assert "config error: dpo_app.generate_arithmetic needs one data_args.file_name" in proc.stderr


@pytest.mark.parametrize(
    ("override", "error"),
    [  # -1 answered every held-out prompt but the last (a slice [:-1]); "abc" failed mid-run
        ("dpo_app.greedy_eval_prompts=-1", "dpo_app.greedy_eval_prompts=-1: must be >= 0"),
        ("dpo_app.greedy_eval_prompts=abc", "dpo_app.greedy_eval_prompts: expected an integer"),
        ("dpo_app.arithmetic.train_rows=0", "dpo_app.arithmetic.train_rows=0: must be >= 1"),
    ],
)
def test_bad_app_options_are_config_errors_in_a_dry_run(override, error, capsys):
    from tests.app_loading import app_main

    assert app_main("dpo")(["--dry-run", override]) == 1
    assert capsys.readouterr().err.startswith(f"config error: {error}")


@pytest.mark.slow
def test_lora_dpo_trains_the_adapter_against_its_base_model(tmp_path):
    """DPO with a LoRA adapter: no reference worker; the reference log-probs are actor_train's
    with its adapter disabled, cached or on the fly alike. Step 1 starts at the reference (peft's
    B = 0): every margin 0 and the sigmoid loss ln 2; step 2 has moved away from it (a reference
    that followed the policy would give ln 2 again). The exported model is the merged one: base
    names, norms and embeddings untouched, adapted weights moved."""
    from safetensors.torch import load_file

    lora = {
        "actor_train.model_args.lora_target": "all-linear",
        "actor_train.model_args.lora_rank": 4,
        "actor_train.training_args.learning_rate": 1e-2,
    }
    cached = _run(tmp_path / "cached", precompute_ref_log_probs="true", **lora)
    fly = _run(tmp_path / "fly", precompute_ref_log_probs="false", **lora)
    assert [r["step"] for r in cached] == [1, 2]
    for a, b in zip(cached, fly, strict=True):
        for key in ("train/loss", "train/rewards/margins", "train/logps/chosen"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-7), key
    first, second = cached
    assert first["train/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert first["train/rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert abs(second["train/loss"] - math.log(2)) > 1e-4
    assert abs(second["train/rewards/margins"]) > 1e-4
    before = load_file(str(tmp_path / "tiny_model" / "model.safetensors"))
    after = load_file(str(tmp_path / "cached" / "hf_model" / "model.safetensors"))
    assert after.keys() == before.keys()
    assert all(before[k].equal(after[k]) for k in before if "norm" in k or "embed" in k)
    assert any(not before[k].equal(after[k]) for k in before if "proj" in k)
