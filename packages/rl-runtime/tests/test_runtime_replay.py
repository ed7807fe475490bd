"""Recorded learn calls (`record_steps`) and `rl-replay`: a replay equals the recorded step
bit-exactly, `--set` changes what it should, a NaN injected by a test fault is recorded and
located, and a tampered record is refused. One process, a tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rl_runtime.cli.replay import main as replay_main
from rl_runtime.cli.replay import replay
from rl_runtime.cluster.train_worker import TrainWorker
from rl_runtime.state.recorder import StepRecorder, anomalous
from rl_runtime.state.step_record import RecordError, read_record
from rl_train.args import TrainingArgs
from rl_train.faults import FAULT_ENV
from rl_train.losses import ActorLossConfig
from rl_train.testing import make_batch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    from rl_rollout.tiny_model import build_tiny_model

    return str(
        build_tiny_model(
            tmp_path_factory.mktemp("tiny"),
            hidden_size=64,
            num_heads=1,
            intermediate_size=64,
            seed=0,
        )
    )


class OneRank:
    """The worker-group calls the recorder makes, on one in-process TrainWorker."""

    def __init__(self, worker: TrainWorker) -> None:
        self.worker = worker
        self.workers = [worker]

    def call_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return [getattr(self.worker, method)(*args, **kwargs)]


def _worker(model: str, strategy: str = "fsdp2_train") -> TrainWorker:
    return TrainWorker(
        rank=0, world_size=1, dist_env={}, role="actor", model_path=model,
        strategy_name=strategy,
        training_args=TrainingArgs(per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                   learning_rate=1e-2, ppo_epochs=1, shuffle_mini_batches=True),
        loss_config=ActorLossConfig(policy_loss="ppo_clip", entropy_loss_coef=0.0),
    )  # fmt: skip


def _batch(seed: int) -> dict[str, torch.Tensor]:
    batch = make_batch(8, 12, vocab=1000, seed=seed)
    g = torch.Generator().manual_seed(seed)
    # old log-probs off the policy's, so the ratios (and the clipping) are not all 1
    batch["old_log_probs"] = -4.0 - torch.rand(8, 12, generator=g)
    return batch


def _run(
    model: str, root: Path, kind: str, every: int, steps: int, nan_at: int = 0, **kw: Any
) -> StepRecorder:
    """`steps` learn calls of a fresh trainer through a recorder (pipeline steps 1..steps);
    step `nan_at` trains on advantages with a NaN (what `step.nan_advantage@N` does)."""
    from rl_runtime.step.policy_update import poisoned_advantages

    worker = _worker(model, **kw)
    group = OneRank(worker)
    recorder = StepRecorder(kind, every, root, config_hash="c0ffee", key_file=None)
    for step in range(1, steps + 1):
        batch = _batch(step)
        if step == nan_at:
            batch["advantages"] = poisoned_advantages(batch["advantages"], batch["response_mask"])
        recorder.train(group, "actor_train", [batch], "default", step=step, weight_version=step,
                       run=lambda b=batch: [worker.train_step(dict(b))])  # fmt: skip
    worker.shutdown()
    return recorder


@pytest.fixture(scope="module")
def recorded(tiny, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("run") / "records"
    recorder = _run(tiny, root, "every", 2, 3)
    assert [(s, r) for s, r, *_ in recorder.written] == [(2, "actor_train")]
    assert recorder.step_metrics(1) == {}
    size = recorder.step_metrics(2)["record/bytes"]
    files = root / "step-2" / "actor_train"
    assert size == sum(f.stat().st_size for f in files.iterdir() if f.is_file()) > 0
    return root


def test_replay_of_a_recorded_step_is_bit_exact(recorded, capsys):
    assert sorted(p.name for p in recorded.iterdir() if not p.name.startswith(".")) == ["step-2"]
    result = replay(recorded / "step-2")
    assert result.bit_exact, result.differences()
    recorded_metrics = result.record.metric_values()
    assert recorded_metrics["actor/optimizer_steps"] == 1.0  # 2 micro-batches
    assert result.weight_checksum == result.record.weight_checksum
    # the replay really trained: the weights after differ from the state before the step
    before = TrainWorker(**_spec_kwargs(result.record, recorded / "step-2"))
    before.load_checkpoint(str(recorded / "step-2" / "actor_train" / "checkpoint"))
    assert before.weight_checksum() != result.weight_checksum
    assert replay_main([str(recorded / "step-2")]) == 0
    assert "bit-exact: yes" in capsys.readouterr().out


def _spec_kwargs(record: Any, _dir: Path) -> dict[str, Any]:
    from rl_train.args import TrainingArgs as TA

    t = record.trainer
    return dict(rank=0, world_size=1, dist_env={}, role=t.backend_role, model_path=t.model_path,
                strategy_name=t.strategy_name, training_args=TA(**t.training_args),
                loss_config=ActorLossConfig(**t.loss_config))  # fmt: skip


def test_set_changes_exactly_the_expected_quantities(recorded):
    """rl_loss_coef 2: the loss and every gradient are exactly doubled (a power of two), the
    policy-loss term itself, its clip fraction and the entropy are not; learning_rate 0: every
    number of the step is as recorded and the weights stay those before the step."""
    base = replay(recorded / "step-2").record.metric_values()
    doubled = replay(recorded / "step-2", change="rl_loss_coef=2.0")
    assert doubled.change == ("loss.rl_loss_coef", 2.0)
    m = doubled.metrics
    assert m["actor/loss"] == 2 * base["actor/loss"]
    assert m["actor/grad_norm"] == 2 * base["actor/grad_norm"]
    for key in ("actor/pg_loss", "actor/entropy"):
        assert m[key] == base[key], key
    assert doubled.weight_checksum != doubled.record.weight_checksum
    assert set(doubled.differences()) >= {"actor/loss", "actor/grad_norm", "weight_checksum"}

    frozen = replay(recorded / "step-2", change="training.learning_rate=0.0")
    assert [k for k in frozen.differences() if not k.endswith("/lr")] == ["weight_checksum"]
    before = TrainWorker(**_spec_kwargs(frozen.record, recorded / "step-2"))
    before.load_checkpoint(str(recorded / "step-2" / "actor_train" / "checkpoint"))
    assert frozen.weight_checksum == before.weight_checksum()

    with pytest.raises(ValueError, match="no such field"):
        replay(recorded / "step-2", change="clip_everything=1")


def test_a_nan_injected_by_a_fault_is_recorded_and_located(tiny, tmp_path, monkeypatch, capsys):
    """`train.nan_weight@1`: the first step's update ends with a NaN in the first norm weight;
    `nonfinite` records step 2 only (step 1 was finite), the replay reproduces it bit-exactly
    and --detect-anomaly names the module and parameter where the NaN arose."""
    monkeypatch.setenv(FAULT_ENV, "train.nan_weight@1")
    root = tmp_path / "records"
    recorder = _run(tiny, root, "nonfinite", 0, 3)
    monkeypatch.delenv(FAULT_ENV)
    assert [s for s, *_ in recorder.written] == [2, 3]
    result = replay(root / "step-2")
    assert result.bit_exact, result.differences()
    assert anomalous(result.record.metric_values())
    found = replay(root / "step-2", detect_anomaly=True).anomaly
    assert found["module"] == "model.layers.0.input_layernorm"
    assert found["nonfinite_parameters"] == "weight"
    assert found["inputs"] == "finite"
    assert replay_main([str(root / "step-2"), "--detect-anomaly"]) == 0
    assert "anomaly module: model.layers.0.input_layernorm" in capsys.readouterr().out


def test_a_nan_advantage_is_recorded_and_named(tiny, tmp_path):
    """A NaN advantage at step 2: the guard skips that update (step 3 is finite again), only
    step 2 is recorded, and --detect-anomaly names the batch tensor, no module."""
    recorder = _run(tiny, tmp_path / "records", "nonfinite", 0, 3, nan_at=2)
    assert [s for s, *_ in recorder.written] == [2]
    result = replay(tmp_path / "records" / "step-2", detect_anomaly=True)
    assert result.record.metric_values()["actor/skipped_steps"] == 1.0
    assert result.anomaly["batch"].startswith("advantages (1 non-finite, first at [0, ")
    assert "module" not in result.anomaly
    assert "returned nan" in result.anomaly["backward"]
    assert replay(tmp_path / "records" / "step-2").bit_exact


def _tampered(recorded: Path, tmp_path: Path, name: str) -> Path:
    """A copy of the recorded step-2 directory (named step-2, as recorded)."""
    import shutil

    step = tmp_path / name / "step-2"
    shutil.copytree(recorded / "step-2", step)
    return step


def test_a_tampered_record_is_refused_naming_the_file(recorded, tmp_path, capsys):
    """The record's signed manifest covers its batch, its metadata and its checkpoint: a byte
    flipped in any of them, a field edited, a file added, the manifest re-written without the
    key, or the record moved to another step's directory is refused, naming the file."""
    from rl_train.signing import MANIFEST, SIGNATURE

    assert read_record(recorded / "step-2" / "actor_train")[0].step == 2

    def flip(path: Path, at: int = -1) -> None:
        data = bytearray(path.read_bytes())
        data[at] ^= 1
        path.write_bytes(bytes(data))

    step = _tampered(recorded, tmp_path, "batch")
    flip(step / "actor_train" / "rank0.safetensors")
    with pytest.raises(RecordError, match="file rank0.safetensors fails its sha256 check"):
        read_record(step / "actor_train")
    assert replay_main([str(step)]) == 2
    assert "rank0.safetensors" in capsys.readouterr().err

    # metadata: a field edited (the recorded loss), same size or not
    step = _tampered(recorded, tmp_path, "meta")
    meta_path = step / "actor_train" / "record.json"
    meta = json.loads(meta_path.read_text())
    meta["metrics"]["actor/loss"] = (0.5).hex()
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(RecordError, match="file record.json has .* bytes, manifest says"):
        read_record(step / "actor_train")

    # the checkpoint the replay starts from: one byte of its weights
    step = _tampered(recorded, tmp_path, "ckpt")
    ckpt = step / "actor_train" / "checkpoint"
    biggest = max((p for p in ckpt.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    flip(biggest, at=biggest.stat().st_size // 2)
    rel = biggest.relative_to(step / "actor_train").as_posix()
    with pytest.raises(RecordError, match=f"file {rel} fails its sha256 check"):
        read_record(step / "actor_train")
    assert replay_main([str(step)]) == 2
    assert rel in capsys.readouterr().err

    # a file slipped in; a manifest re-written to match a change, without the key
    step = _tampered(recorded, tmp_path, "extra")
    (step / "actor_train" / "rank1.safetensors").write_bytes(b"{}")
    with pytest.raises(RecordError, match=f"file rank1.safetensors is not in {MANIFEST}"):
        read_record(step / "actor_train")
    step = _tampered(recorded, tmp_path, "resigned")
    manifest = json.loads((step / "actor_train" / MANIFEST).read_text())
    manifest["files"]["record.json"]["bytes"] += 1
    (step / "actor_train" / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(RecordError, match=f"{MANIFEST} fails its HMAC check"):
        read_record(step / "actor_train")

    # moved to another step's directory; the signature removed
    step = _tampered(recorded, tmp_path, "moved")
    step.rename(step.with_name("step-3"))
    with pytest.raises(RecordError, match="signed for step 2, but the directory is step 3"):
        read_record(step.with_name("step-3") / "actor_train")
    step = _tampered(recorded, tmp_path, "unsigned")
    (step / "actor_train" / SIGNATURE).unlink()
    with pytest.raises(RecordError, match=f"missing file {SIGNATURE}"):
        read_record(step / "actor_train")


def test_record_steps_refuses_the_triggers_it_does_not_implement():
    from rl_config.schema.pipeline import parse_record_steps

    assert parse_record_steps("every:3") == ("every", 3)
    assert parse_record_steps("nonfinite") == ("nonfinite", 0)
    with pytest.raises(ValueError, match="spike beyond k sigma.*not implemented"):
        parse_record_steps("spike:3")
    with pytest.raises(ValueError, match="collapse of the mean reward.*not implemented"):
        parse_record_steps("reward_collapse")
    with pytest.raises(ValueError, match="expected none, every:N"):
        parse_record_steps("every:0")


@pytest.mark.slow
@pytest.mark.xdist_group("dist")
def test_a_two_rank_step_replays_bit_exactly_in_two_gloo_processes(tmp_path):
    """fsdp2_train on 2 gloo ranks records step 2 (each rank's rows and RNG state, the sharded
    checkpoint); rl-replay replays it in 2 processes to the same metrics and weights."""
    from replay_ranks import record_two_steps

    from rl_rollout.tiny_model import build_tiny_model
    from rl_train.dist import spawn

    model = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_heads=1, intermediate_size=64)
    root = tmp_path / "records"
    spawn(record_two_steps, 2, str(model), str(root), "fsdp2_train", env={"OMP_NUM_THREADS": "1"})
    result = replay(root / "step-2")
    assert result.record.trainer.world_size == 2
    assert sorted(result.record.files) == ["rank0.safetensors", "rank1.safetensors"]
    assert result.bit_exact, result.differences()
