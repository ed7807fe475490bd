"""Asynchronous training end to end on real Ray (apps/rlvr's recipe, a tiny model, a few steps):
`max_staleness: 0` through the asynchronous machinery equals the synchronous path, one-step-off
runs ahead within its bound, and a resumed run keeps the bound and the prompt order."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "rlvr"

# the in-process runs join the module's Ray cluster (`shared_ray`); the subprocesses start theirs
pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("ray"),
    pytest.mark.usefixtures("shared_ray"),
]

# actor_train on (CPU) device 0, the engine on device 1: rollout can run while training does
LAYOUT = {
    "num_gpus_per_node": 2,
    "actor_train.device_mapping": "[0]",
    "actor_infer.device_mapping": "[1]",
    "reference.device_mapping": "[0]",
}


def _overrides(out: Path, extra: dict[str, Any]) -> list[str]:
    base = {
        "output_dir": out, "logging_dir": out / "logs", "checkpoint_config.output_dir": out / "ckpt",
        "pretrain": out.parent / "tiny_model", "track_with": "stdout",
        "rlvr_app.build_tiny_model": out.parent / "tiny_model",
        "max_steps": 3, "eval_steps": 100, "save_steps": 1000, "dynamic_sampling.enable": "false",
        "rollout_batch_size": 4, "num_return_sequences_in_group": 4, "val_batch_size": 8,
        "val_n_sample": 2, "actor_train.training_args.per_device_train_batch_size": 8,
        "actor_train.training_args.gradient_accumulation_steps": 2,
        "rlvr_app.warmup.steps": 2, "rlvr_app.warmup.batch_size": 8, "rlvr_app.warmup.demos": 16,
        "train_infer_correction.is_weight.enabled": "true",
        "train_infer_correction.is_weight.upper_bound": 2.0,
        **LAYOUT, **extra,
    }  # fmt: skip
    return [f"{k}={v}" for k, v in base.items()]


def run_rlvr(out: Path, asynchronous: Any = "config", **extra: Any) -> tuple[Any, list[dict]]:
    """apps/rlvr's run in this process (Ray workers); `asynchronous` replaces the composed
    async plan when given. Returns the RunResult and the per-step metrics rows."""
    from rl_app_rlvr.spec import DEFAULT_CONFIG, compose, load, run

    cfg, app = load(DEFAULT_CONFIG, _overrides(out, extra))
    composed = compose(cfg)
    if asynchronous != "config":
        composed.components = dataclasses.replace(composed.components, asynchronous=asynchronous)
    result = run(cfg, app, composed)
    rows = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return result, [r for r in rows if r["step"] > 0 and "train/loss" in r]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Relative data paths of the CPU default land in tmp_path."""
    monkeypatch.chdir(tmp_path)


COMPARED = ("reward/mean", "reward/accuracy", "response/length_mean", "rollout/response_tokens",
            "train/loss", "train/pg_loss", "train/grad_norm", "sync/weight_version",
            "rollout/num_trajectories")  # fmt: skip


def test_zero_staleness_through_the_async_machinery_equals_synchronous(tmp_path):
    """The producer thread, queue and staleness filter with max_staleness 0 train on exactly
    what the synchronous loop trains on (verl #4449: a "staleness 0" that was not on-policy)."""
    from rl_runtime.compose import AsyncPlan

    _, sync = run_rlvr(tmp_path / "sync")
    zero = AsyncPlan(max_staleness=0, queue_samples=16, wait_timeout_s=600.0, source="test")
    for transport, staged in (("auto", 1.0), ("broadcast", None)):
        # shared memory on one node: the trainer stages its weights and rollout delivers them
        # between batches (Context.sync_producer); broadcast: the sync waits for the batch
        out = tmp_path / f"async0-{transport}"
        result, asyn = run_rlvr(out, asynchronous=zero, weight_sync_transport=transport)
        assert [r["step"] for r in sync] == [r["step"] for r in asyn] == [1, 2, 3]
        for s, a in zip(sync, asyn, strict=True):
            for key in COMPARED:
                assert a[key] == pytest.approx(s[key], rel=1e-6, abs=1e-7), (s["step"], key)
            assert a["async/lag_max"] == 0 and a["async/dropped_stale_samples"] == 0
            assert a["async/lag_hist/0"] == 16 and a.get("sync/staged") == staged, transport
        assert result.throughput["samples_trained"] == 48


def test_one_step_off_runs_ahead_within_its_bound_and_resumes_within_it(tmp_path):
    """max_staleness 1 (verl's one-step-off): rollout generates the next batch with the previous
    weights while the trainer trains (lag 1 observed, never more, nothing dropped). A run stopped
    at step 2 and resumed keeps the bound (AReaL #1388) and draws, at step 3, the prompts the
    trainer had not consumed: the checkpoint holds the sampler before batch 2, not where
    rollout had drawn ahead to.

    One run of 4 steps, stopped after step 2 and resumed: the run-ahead assertions hold over its
    4 steps (an uninterrupted 4-step run of its own proved nothing more)."""
    one = {"async.max_staleness": 1, "max_steps": 4}
    part = tmp_path / "part"
    result, first = run_rlvr(part, **{**one, "max_steps": 2, "save_steps": 2})
    assert [r["step"] for r in first] == [1, 2]
    assert result.throughput["samples_per_s"] > 0
    ckpt = json.loads(
        next((part / "ckpt").glob("step-000002")).joinpath("run_state.json").read_text()
    )
    bookkeeping = ckpt["extra"]["async"]
    assert (
        bookkeeping["next_index"] == 2 and bookkeeping["trainer_version"] == ckpt["weight_version"]
    )
    (sampler,) = bookkeeping["rollout_state"]["sampler"]["domains"].values()
    assert sampler["position"] == 8  # before batch 2: 2 batches x 4 prompts consumed
    _, rows = run_rlvr(part, **{**one, "resume_from_checkpoint": "true"})
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # the log file holds the first part's too
    lags = [r["async/lag_max"] for r in rows]
    assert max(lags) == 1 and all(r["async/dropped_stale_samples"] == 0 for r in rows)
    assert rows[0]["async/lag_max"] == 0  # batch 0: generated with the warm-up's weights
    for r in rows:
        assert r["sync/staged"] == 1.0  # delivered between batches: the trainer did not wait
        assert r["async/lag_hist/0"] + r["async/lag_hist/1"] == r["rollout/num_trajectories"]
        assert r["async/queue_depth"] <= 16 and r["async/trainer_idle_s"] >= 0
    resumed = rows[2:]
    assert resumed[0]["async/lag_max"] == 0  # the first batch after a resume: restored weights
    assert resumed[0]["async/trained_samples_total"] == 48  # 2 x 16 before, 16 now


def test_staleness_two_scores_ahead_within_its_bound(tmp_path):
    """max_staleness 2 without partial rollout: rollout scores batch k on its finisher thread
    while batch k + 1 generates (RLVR, dynamic sampling off: `PendingBatch`), weights staged in
    two alternating buffers; the run keeps the bound (lag 2 reached, never more, nothing
    dropped), trains every sample and reports each sync as staged."""
    result, rows = run_rlvr(tmp_path / "two", **{"async.max_staleness": 2, "max_steps": 5})
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert max(r["async/lag_max"] for r in rows) == 2
    assert all(r["async/lag_max"] <= 2 and r["async/dropped_stale_samples"] == 0 for r in rows)
    assert all(r["sync/staged"] == 1.0 and r["sync/superseded"] in (0.0, 1.0) for r in rows)
    assert result.throughput["samples_trained"] == 5 * 16


def test_partial_rollout_trains_within_the_bound(tmp_path):
    """async.partial_rollout: the weight sync of step t reaches the engine while it generates
    batch t + 1 (the engine swaps at a decode-step boundary; tokens keep their versions). The
    run neither hangs nor exceeds the bound; staleness counts from each sample's oldest token."""
    result, rows = run_rlvr(
        tmp_path / "partial", **{"async.max_staleness": 1, "async.partial_rollout": "true"}
    )
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["async/lag_max"] <= 1 and r["async/dropped_stale_samples"] == 0 for r in rows)
    assert result.throughput["samples_trained"] == 48


def test_agentic_pipeline_trains_one_step_off_by_config(tmp_path):
    """apps/agentic with `async.max_staleness: 1` (rollout on its own CPU bundle): episodes are
    played ahead of the trainer within the bound, after every sync the engines hold exactly
    the trainer's weights, and a checkpoint mid-run (step 2, rollout already ahead) is written.
    Before, that checkpoint failed the run: "no rollout state recorded for batch 2"."""
    import subprocess

    from tests.test_agentic_e2e import APP as AGENTIC
    from tests.test_agentic_e2e import CONFIG as AGENTIC_CONFIG
    from tests.test_agentic_e2e import _overrides as agentic

    out = tmp_path / "agentic_async"
    extra = {"async.max_staleness": 1, "max_steps": 3, "eval_steps": 3, "save_steps": 2,
             "agentic_app.export_hf": "false", **LAYOUT, "agentic_app.num_cpus": 2}  # fmt: skip
    cmd = [sys.executable, str(AGENTIC), "--config", str(AGENTIC_CONFIG), *agentic(out, **extra)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0 and "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert max(r["async/lag_max"] for r in steps) == 1  # it did run ahead, never further
    for r in steps:
        assert r["async/dropped_stale_samples"] == 0 and r["rollout/num_trajectories"] == 8
        assert r["sync/max_abs_diff"] == 0.0 and r["failures/episodes"] == 0.0
        assert r["sync/staged"] == 1.0  # staged, delivered between batches, then compared
    assert "val/success_rate" in steps[-1]
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == ["step-000002", "step-000003"]


def test_agentic_lora_actor_and_critic_train_one_step_off(tmp_path):
    """apps/agentic one step off with LoRA on the actor and on a GAE critic, and a KL loss whose
    reference is the actor's base model (its adapter disabled, no reference worker): every
    staged sync carries the adapter only and leaves the engines holding the trainer's merged
    weights; the checkpoints hold the actor's adapter and the critic's adapter and value head,
    not the frozen base weights."""
    import subprocess

    from torch.distributed.checkpoint import FileSystemReader

    from tests.test_agentic_e2e import APP as AGENTIC
    from tests.test_agentic_e2e import CONFIG as AGENTIC_CONFIG
    from tests.test_agentic_e2e import _overrides as agentic

    out = tmp_path / "agentic_lora"
    lora = "{lora_target: all-linear, lora_rank: 4}"
    critic = ("{model_args: " + lora + ", training_args: {per_device_train_batch_size: 8}, "
              "device_mapping: [0], strategy_args: {strategy_name: fsdp2_train, "
              "strategy_config: {}}}")  # fmt: skip
    extra = {"async.max_staleness": 1, "max_steps": 3, "eval_steps": 0, "save_steps": 1000,
             "agentic_app.export_hf": "false", **LAYOUT, "agentic_app.num_cpus": 2,
             "agentic_app.warmup.steps": 0, "adv_estimator": "gae", "use_kl_loss": "true",
             "kl_loss_coef": 0.1, "actor_train.model_args.lora_target": "all-linear",
             "actor_train.model_args.lora_rank": 4, "+critic": critic}  # fmt: skip
    cmd = [sys.executable, str(AGENTIC), "--config", str(AGENTIC_CONFIG), *agentic(out, **extra)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "no reference worker starts" in proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0 and "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert max(r["async/lag_max"] for r in steps) == 1
    model = tmp_path / "tiny_model" / "model.safetensors"
    for r in steps:
        assert r["sync/max_abs_diff"] == 0.0 and r["sync/staged"] == 1.0
        assert 0 < r["sync/bytes"] < model.stat().st_size / 10  # the adapter only
        assert math.isfinite(r["critic/vf_loss"]) and math.isfinite(r["train/loss"])

    def saved(role: str) -> set[str]:
        (ckpt,) = (out / "ckpt" / "step-000003" / role).glob("step-*")
        meta = FileSystemReader(str(ckpt / "model_optim")).read_metadata().state_dict_metadata
        return {k.removeprefix("model.") for k in meta if k.startswith("model.")}

    assert saved("actor_train") and all(".lora_" in k for k in saved("actor_train"))
    critic_keys = saved("critic")
    assert {k for k in critic_keys if ".lora_" not in k} == {"score.weight", "score.bias"}


def test_a_resumed_one_step_off_run_continues_the_run_totals_exactly(tmp_path):
    """max_staleness 1 with reward failures in training and in every evaluation (code rows
    without tests). The uninterrupted run saves at step 2 mid-run; resumed from that checkpoint,
    steps 3 and 4 report the uninterrupted run's totals: the training rollouts' failures
    (`reward/failures/*`, the trainer's state, added up as it learns on each batch: rollout
    scores batch k while batch k + 1 generates, after the sampler's snapshot), the evaluations'
    (`val/reward_failures/*`: evaluation runs on the trainer while rollout draws ahead, so its
    totals are the trainer's state at the checkpoint, not rollout's at its snapshot), and the
    run's trained samples (`RunResult.throughput`). Before, the evaluations' failures were
    counted into the rollout totals, the evaluation at step 2 after batch 2's snapshot."""
    import shutil

    from tests.test_rlvr_app import CODE_WORKER, _code_rows

    data = tmp_path / "code"
    data.mkdir()
    untested = [{"id": f"bad{i}", "tag": "code", "prompt": f"def f(x): x+1 #b{i}",
                 "ground_truth": "7"} for i in range(2)]  # fmt: skip
    (data / "train.jsonl").write_text(
        "\n".join(json.dumps(r) for r in [*_code_rows(6), *untested]) + "\n"
    )
    (data / "val.jsonl").write_text(
        "\n".join(json.dumps(r) for r in [*_code_rows(2, start=100), untested[0]]) + "\n"
    )
    common = {
        "async.max_staleness": 1, "max_steps": 4, "eval_steps": 2, "save_steps": 2,
        "rlvr_app.arith_data.generate": "false", "rlvr_app.warmup.steps": 0,
        "actor_train.data_args.file_name": data / "train.jsonl",
        "actor_train.data_args.eval_file_name": data / "val.jsonl",
        "rewards.code.worker_cls": CODE_WORKER, "rewards.code.tag_included": "[code]",
        "val_greedy": "false",
    }  # fmt: skip
    full_result, full = run_rlvr(tmp_path / "full", **common)
    part = tmp_path / "part"  # the uninterrupted run's checkpoint of step 2, resumed
    shutil.copytree(tmp_path / "full" / "ckpt" / "step-000002", part / "ckpt" / "step-000002")
    resumed_result, resumed = run_rlvr(part, **{**common, "resume_from_checkpoint": "true"})
    assert [r["step"] for r in full] == [1, 2, 3, 4] and [r["step"] for r in resumed] == [3, 4]

    def totals(row: dict, prefix: str) -> dict:
        return {k: v for k, v in row.items() if k.startswith(prefix)}

    # every untested training row fails its 4 samples, once per epoch of 8 rows (2 steps)
    assert sum(totals(full[-1], "reward/failures/").values()) == 16
    # the held-out untested row fails both samples in each evaluation: before, at 2 and at 4
    assert sum(totals(full[-1], "val/reward_failures/").values()) == 6
    for f, r in zip(full[2:], resumed, strict=True):
        for prefix in ("reward/failures/", "val/reward_failures/"):
            assert totals(r, prefix) == totals(f, prefix), (f["step"], prefix)
    assert resumed_result.throughput["samples_trained"] == 64 - 16  # failed samples not trained
    assert full_result.throughput["samples_trained"] == 64 - 16
    # the lag totals agree: before, async/trained_samples_total counted the failed samples (64)
    assert full[-1]["async/trained_samples_total"] == 64 - 16
    assert resumed[-1]["async/trained_samples_total"] == 64 - 16
