"""Every tools/bench/ script runs end to end in its quickest mode and prints what its docstring
promises (rc 0, the promised line or keys). Nothing is measured: the numbers mean nothing here.

The benches' own arithmetic is unit-tested beside this (test_bench_async.py,
test_bench_grpo_floor.py, test_bench_proc_cpu.py); proc_cpu.py and char_model.py are libraries
the benches below import, so they run through them. Runs over ~20 s are marked slow.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tools" / "bench"
#: the throw-away TRL venv the TRL comparisons run in (never a dependency of this workspace)
TRL_PYTHON = Path("/tmp/trl-env/bin/python")
needs_trl = pytest.mark.skipif(not TRL_PYTHON.exists(), reason=f"no TRL venv at {TRL_PYTHON}")


def run_bench(
    script: str, *args: str, tmp: Path | None = None, python: str = sys.executable
) -> str:
    """Run `tools/bench/<script>` from the repository root; its stdout (rc 0 asserted, stderr
    shown on failure). With `tmp`, the bench's temp files (models, work dirs) go under it."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    proc = subprocess.run(
        [python, str(BENCH / script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc.stdout


def last_line(out: str) -> str:
    return out.strip().splitlines()[-1]


def json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


# -- fast --------------------------------------------------------------------------------------


def test_records_small_batch_prints_both_ops(tmp_path: Path):
    out = run_bench("records.py", "--trajectories", "4", "--tokens", "128", "--repeats", "1")
    assert out.splitlines()[0] == "4 trajectories x 128 tokens"
    for op in ("encode", "decode+validate"):
        assert re.search(rf"^{re.escape(op)} +[\d.]+ +[\d.]+ +[\d.]+x$", out, re.M), out


def test_envs_quick_prints_the_three_tables():
    out = run_bench("envs.py", "--quick")
    for heading in ("## Level generation", "## Env steps", "## Reward calls"):
        assert heading in out
    for row in (
        "| SimpleSokoban |",
        "| FrozenLakeThink |",
        "| math_score sandboxed, 64 per call |",
    ):
        assert row in out


@pytest.mark.parametrize("script", ["dpo_trl.py", "grpo_step_trl.py"])
def test_trl_sides_parse_their_arguments(script: str):
    """TRL's sides run in the TRL venv; without it, at least their command lines parse."""
    out = run_bench(script, "--help")
    assert "--model" in out


# -- slow --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_algos_quick_prints_one_json_row_per_case():
    rows = json_lines(run_bench("algos.py", "--quick"))
    cases = [r["case"] for r in rows]
    assert any(c.startswith("gae ") for c in cases)
    assert any(c.startswith("grpo N=") and "shuffled" in c for c in cases)
    assert any(c.startswith("log-prob+entropy") for c in cases)
    gae = next(r for r in rows if r["case"].startswith("gae "))
    assert gae["max_abs_err"] <= 1e-5  # the docstring's agreement bound


@pytest.mark.slow
def test_record_step_one_round_prints_the_ratio():
    out = run_bench(
        "record_step.py", "--rounds", "1", "--block", "2", "--rows", "4", "--tokens", "16"
    )
    assert re.search(r"record_bytes_per_step=\d+ checkpoints=1 checkpoint_bytes_each=\d+", out), out
    assert re.match(r"record_ratio=[\d.]+$", last_line(out))


@pytest.mark.slow
def test_record_app_step_one_dpo_round_prints_the_ratio(tmp_path: Path):
    out = run_bench("record_app_step.py", "--apps", "dpo", "--rounds", "1", "--steps", "3",
                    "--no-ray", tmp=tmp_path)  # fmt: skip
    # 2 measured steps per mode (the first apart); a record of every recorded step
    assert re.search(r"dpo: 2 steps per mode: plain [\d.]+ s per step, recorded [\d.]+ s; "
                     r"per round ratio [\d.]+; record [1-9]\d* bytes per step", out), out  # fmt: skip
    assert re.match(r"dpo record_ratio=[\d.]+$", last_line(out))
    assert len(list(tmp_path.glob("record-app-dpo-*/run-0-every1/records/step-*"))) == 3


@pytest.mark.slow
def test_old_log_probs_one_repeat_prints_the_ratio():
    out = run_bench("old_log_probs.py", "--repeats", "1")
    assert re.search(r"whole [\d.]+ s, after_first [\d.]+ s per train_step", out), out
    assert re.match(r"ratio whole/after_first [\d.]+ \(median of per-repeat ratios", last_line(out))


@pytest.mark.slow
def test_shared_prompt_one_repeat_writes_every_timing(tmp_path: Path):
    out_json = tmp_path / "shared.json"
    out = run_bench(
        "shared_prompt.py", "--shape", "rlvr_cpu", "--repeats", "1", "--json", str(out_json),
        tmp=tmp_path,
    )  # fmt: skip
    assert "plain/shared" in out
    result = json.loads(out_json.read_text())["rlvr_cpu"]
    for phase in ("train_micro_step", "logprob_forward"):
        assert len(result[phase]["plain_s"]) == len(result[phase]["shared_s"]) == 1
        assert result[phase]["ratio_of_medians"] > 0


GRPO_TINY = ("--steps", "1", "--prompts-per-step", "2", "--group", "2", "--new-tokens", "8",
             "--micro-batch", "4")  # fmt: skip


@pytest.mark.slow
def test_grpo_step_tiny_ends_with_the_median(tmp_path: Path):
    out = run_bench("grpo_step.py", *GRPO_TINY, "--json", str(tmp_path / "g.json"), tmp=tmp_path)
    assert re.fullmatch(r"median_s_per_step=\d+\.\d+", last_line(out)), out
    assert "arithmetic floor at the measured GEMM rate" in out
    records = json.loads((tmp_path / "g.json").read_text())
    assert len(records["ours"]) == 1 and records["trl"] == []  # the warm-up step is excluded


@pytest.mark.slow
@needs_trl
def test_grpo_step_tiny_side_by_side_with_trl(tmp_path: Path):
    out = run_bench("grpo_step.py", *GRPO_TINY, "--trl", "--trl-python", str(TRL_PYTHON),
                    tmp=tmp_path)  # fmt: skip
    assert re.search(r"^ours/trl per step \(paired\): median [\d.]+", out, re.M), out
    assert re.fullmatch(r"median_s_per_step=\d+\.\d+", last_line(out))


DPO_TINY = ("--steps", "1", "--warmup", "0", "--pairs", "2", "--length", "8")


@pytest.mark.slow
def test_dpo_step_tiny_ends_with_the_median(tmp_path: Path):
    out = run_bench("dpo_step.py", "--model", str(tmp_path / "char"), *DPO_TINY, "--no-trl",
                    "--compare-shared")  # fmt: skip
    assert re.search(r"^arithmetic floor at the measured GEMM rate \(\d+ GFLOP/s\): unshared "
                     r"\(as TRL\) [\d.]+ s, prompt shared [\d.]+ s$", out, re.M), out  # fmt: skip
    for side in ("ours \\(hf_infer\\)", "ours with share_prompt_forward"):
        assert re.search(rf"^{side}: median [\d.]+ s/step \([\d.]+x its floor\)", out, re.M), out
    assert re.search(r"^ratio shared/unshared = [\d.]+$", out, re.M), out
    assert re.fullmatch(r"median_s_per_step=\d+\.\d+", last_line(out)), out


@pytest.mark.slow
@needs_trl
def test_dpo_step_tiny_side_by_side_with_trl(tmp_path: Path):
    out = run_bench("dpo_step.py", "--model", str(tmp_path / "char"), *DPO_TINY,
                    "--trl-python", str(TRL_PYTHON))  # fmt: skip
    assert re.search(r"^ratio ours/TRL = [\d.]+$", out, re.M), out
    assert re.fullmatch(r"median_s_per_step=\d+\.\d+", last_line(out))


@pytest.mark.slow
def test_rollout_tiny_prints_engine_and_agent_loop_rows(tmp_path: Path):
    out = run_bench(
        "rollout.py", "--batch", "2", "--new-tokens", "4", "--episodes", "4",
        "--max-tokens-per-step", "8", "--model-dir", str(tmp_path / "tiny"), tmp=tmp_path,
    )  # fmt: skip
    assert "| transformers model.generate (baseline) |" in out
    assert "| hf_infer engine, 2 x 4 tokens |" in out
    assert re.search(r"\| hf_infer agent loop env-async \(game envs.*x vs lockstep", out), out


@pytest.mark.slow
def test_sync_tiny_state_prints_every_cpu_path(tmp_path: Path):
    out = run_bench("sync.py", "--size-gb", "0.01", "--buckets-mb", "4", "--repeats", "1",
                    tmp=tmp_path)  # fmt: skip
    for path in ("gloo raw broadcast", "WeightSender -> WeightReceiver",
                 "IpcSender -> IpcReceiver (/dev/shm)", "IpcSender -> IpcReceiver (adopt"):  # fmt: skip
        assert path in out


@pytest.mark.slow
def test_train_batching_section_and_no_leftover_temp_dir(tmp_path: Path):
    out = run_bench("train.py", "--skip-backends", tmp=tmp_path)
    assert "## Dynamic batching and packing" in out
    assert "| dynamic, 1024-token budget + packing | 3 | 0 |" in out
    # its model and work dir are removed (torch may leave its own torchinductor_<user> cache)
    assert list(tmp_path.glob("bench_train_*")) == []


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("RL_BENCH_SMOKE_ASYNC"),
    reason="two Ray runs, 2-5 min on 2 cores: too long for CI's slow step, where "
    "tests/test_async_training.py runs the same pipeline; set RL_BENCH_SMOKE_ASYNC=1",
)
def test_async_quick_writes_the_report(tmp_path: Path):
    out_dir = tmp_path / "bench_async"
    run_bench("async.py", "--quick", "--runs", "sync", "staleness_2_partial", "--out", str(out_dir))
    report = json.loads((out_dir / "async_bench.json").read_text())
    assert report["steps"] == 3
    assert set(report["runs"]) == {"sync", "staleness_2_partial"}
    assert report["runs"]["staleness_2_partial"]["lag_max"] <= 2
    assert set(report["measured_speedup"]) == {"staleness_2_partial"}


@pytest.mark.slow
def test_lora_quick_prints_lora_against_full(tmp_path: Path):
    out_json = tmp_path / "lora.json"
    out = run_bench(
        "lora.py", "--layers", "1", "--vocab", "8192", "--seq", "16", "--batch", "2", "--micro", "1",
        "--steps", "1",
        "--threads", "1", "--json", str(out_json), tmp=tmp_path,
    )  # fmt: skip
    assert "| lora / full |" in out
    full, lora, ratio = json_lines(out_json.read_text())
    assert full["mode"] == "full" and lora["mode"] == "lora r8 all-linear"
    assert ratio["optimizer_state_mib"] < 0.05 and ratio["sync_mib"] < 0.05
    assert lora["reference_mib"] == 0.0 < full["reference_mib"]
