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
    model: str,
    root: Path,
    record_steps: str,
    steps: int,
    nan_at: int = 0,
    scale: dict[int, float] | None = None,
    rewards: dict[int, float] | None = None,
    chain_every: int = 50,
    **kw: Any,
) -> StepRecorder:
    """`steps` learn calls of a fresh trainer through a recorder (pipeline steps 1..steps);
    step `nan_at` trains on advantages with a NaN (what `step.nan_advantage@N` does), step s on
    advantages times `scale[s]`; `rewards[s]` is step s's `episode_rewards` (every row)."""
    from rl_config.schema.pipeline import parse_record_steps
    from rl_runtime.step.policy_update import poisoned_advantages

    worker = _worker(model, **kw)
    group = OneRank(worker)
    kind, every, triggers = parse_record_steps(record_steps)
    recorder = StepRecorder(
        kind,
        every,
        root,
        config_hash="c0ffee",
        key_file=None,
        triggers=triggers,
        chain_every=chain_every,
    )
    for step in range(1, steps + 1):
        batch = _batch(step)
        if step == nan_at:
            batch["advantages"] = poisoned_advantages(batch["advantages"], batch["response_mask"])
        if scale and step in scale:
            batch["advantages"] = batch["advantages"] * scale[step]
        if rewards is not None:
            batch["episode_rewards"] = torch.full((8,), rewards.get(step, 1.0))
        recorder.train(group, "actor_train", [batch], "default", step=step, weight_version=step,
                       run=lambda b=batch: [worker.train_step(dict(b))])  # fmt: skip
    worker.shutdown()
    recorder.close()  # the background writes done
    return recorder


@pytest.fixture(scope="module")
def recorded(tiny, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("run") / "records"
    recorder = _run(tiny, root, "every:2", 3)
    assert [(s, r) for s, r, *_ in recorder.written] == [(2, "actor_train")]
    size = recorder.step_metrics(3)["record/bytes"]  # the records completed since last asked
    assert recorder.step_metrics(4) == {}
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
    recorder = _run(tiny, root, "nonfinite", 3)
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
    recorder = _run(tiny, tmp_path / "records", "nonfinite", 3, nan_at=2)
    assert [s for s, *_ in recorder.written] == [2]
    result = replay(tmp_path / "records" / "step-2", detect_anomaly=True)
    assert result.record.metric_values()["actor/skipped_steps"] == 1.0
    assert result.anomaly["batch"].startswith("advantages (1 non-finite, first at [0, ")
    assert "module" not in result.anomaly
    assert "returned nan" in result.anomaly["backward"]
    assert replay(tmp_path / "records" / "step-2").bit_exact


def test_every_step_records_chain_to_a_checkpoint_every_n_steps(tiny, recorded, tmp_path):
    """`every:1` with a checkpoint every 3 steps: steps 1 and 4 hold the state before them,
    2-3 and 5 name their base and the records since; the replay of step 3 trains steps 1 and 2
    first and is bit-exact, so is step 5's, and `--set` applies to the replayed step only. A
    record of the chain missing or replaced (even by a validly signed one) is refused."""
    import shutil

    root = tmp_path / "records"
    recorder = _run(tiny, root, "every:1", 5, chain_every=3)
    assert [s for s, *_ in recorder.written] == [1, 2, 3, 4, 5]
    owns = {s: (root / f"step-{s}" / "actor_train" / "checkpoint").is_dir() for s in range(1, 6)}
    assert owns == {1: True, 2: False, 3: False, 4: True, 5: False}
    for step in (3, 5):
        result = replay(root / f"step-{step}")
        assert result.record.base_step == (1 if step == 3 else 4)
        assert sorted(result.record.previous, key=int) == (["1", "2"] if step == 3 else ["4"])
        assert result.bit_exact, (step, result.differences())
    doubled = replay(root / "step-3", change="rl_loss_coef=2.0")
    base = doubled.record.metric_values()
    assert doubled.metrics["actor/loss"] == 2 * base["actor/loss"]
    assert doubled.metrics["actor/pg_loss"] == base["actor/pg_loss"]

    copy = tmp_path / "copy" / "records"
    shutil.copytree(root, copy)
    shutil.rmtree(copy / "step-2")
    with pytest.raises(
        RecordError, match="needs every record since; .*step-2/actor_train is missing"
    ):
        replay(copy / "step-3")
    # step 2 of another run (signed with the same key): not the record step 3 was chained to
    shutil.copytree(recorded / "step-2", copy / "step-2")
    with pytest.raises(RecordError, match="step-2/actor_train: its MANIFEST.json is not the one"):
        replay(copy / "step-3")


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


def test_record_steps_parses_its_triggers_and_refuses_by_name():
    from rl_config.schema.pipeline import parse_record_steps

    assert parse_record_steps("none") == ("none", 0, ())
    assert parse_record_steps("every:3") == ("every", 3, ())
    assert parse_record_steps("nonfinite") == ("anomaly", 0, (("nonfinite", 0.0),))
    assert parse_record_steps("nonfinite+spike:3+reward_collapse:2.5") == (
        "anomaly",
        0,
        (("nonfinite", 0.0), ("spike", 3.0), ("reward_collapse", 2.5)),
    )
    for bad, match in [
        ("spike", "spike:K needs K"),
        ("spike:0", "spike:K needs K"),
        ("reward_collapse:x", "reward_collapse:K needs K"),
        ("spike:inf", "spike:K needs K"),
        ("nonfinite:2", "nonfinite takes no argument"),
        ("spike:2+spike:3", "spike given twice"),
        ("every:0", "every:N needs an integer N >= 1"),
        ("loss_spike:3", "'loss_spike:3' is not a trigger"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_record_steps(bad)
    from rl_config.schema import ExperimentConfig

    with pytest.raises(ValueError, match="record_steps"):
        ExperimentConfig(record_steps="spike:-1")


def test_anomaly_windows_by_hand():
    """Losses 1..5: mean 3, population sd sqrt(2) = 1.41421; spike:2 fires beyond 2.82843 of
    the mean (5.9 fires, 5.8 does not, nor 0.2; -0.9 does), only with 5 values in the window,
    and a non-finite value neither fires it nor joins the window. Mean rewards 0.5, 0.6, 0.5,
    0.6, 0.5: mean 0.54, sd 0.0489898; reward_collapse:3 fires under 0.393031 (0.39 does, 0.40
    does not, a rise to 0.9 does not)."""
    from rl_runtime.state.recorder import AnomalyWatch

    def watch_losses(value: float, history: list[float] = [1, 2, 3, 4, 5]) -> str | None:  # noqa: B006
        watch = AnomalyWatch([("spike", 2.0)])
        for v in history:
            assert watch.after("actor_train", {"actor/loss": v}) is None
        return watch.after("actor_train", {"actor/loss": value})

    assert watch_losses(5.9) == "spike:2 (actor/loss 5.9, previous 20 values' mean 3 sd 1.41)"
    assert watch_losses(5.8) is None and watch_losses(0.2) is None
    assert watch_losses(-0.9) is not None
    assert watch_losses(100.0, history=[1, 2, 3, 4]) is None  # 4 values: too few
    assert watch_losses(5.9, history=[1, 2, float("nan"), 3, 4, 5]) is not None
    # another role, another window; grad norms too; nonfinite alone ignores spikes
    watch = AnomalyWatch([("spike", 2.0), ("nonfinite", 0.0)])
    for v in [1, 2, 3, 4, 5]:
        watch.after("actor_train", {"actor/grad_norm": v})
    assert watch.after("critic", {"critic/grad_norm": 50.0}) is None
    assert (watch.after("actor_train", {"actor/grad_norm": 50.0}) or "").startswith(
        "spike:2 (actor/grad"
    )
    assert watch.after("actor_train", {"actor/loss": float("nan")}) == "nonfinite"

    def watch_rewards(reward: float) -> str | None:
        watch = AnomalyWatch([("reward_collapse", 3.0)])
        for r in [0.5, 0.6, 0.5, 0.6, 0.5]:
            assert watch.before("actor_train", [{"episode_rewards": torch.tensor([r, r])}]) is None
        return watch.before("actor_train", [{"episode_rewards": torch.tensor([reward, reward])}])

    assert (watch_rewards(0.39) or "").startswith(
        "reward_collapse:3 (mean reward 0.39, previous 20"
    )
    assert watch_rewards(0.40) is None and watch_rewards(0.9) is None
    # token rewards [B, T] summed per row when a batch has no episode rewards
    watch = AnomalyWatch([("reward_collapse", 1.0)])
    for _ in range(5):
        watch.before("a", [{"rewards": torch.tensor([[0.0, 1.0], [0.5, 0.5]])}])
    assert watch.before("a", [{"rewards": torch.tensor([[0.0, 0.0], [0.5, 0.0]])}]) is not None
    assert AnomalyWatch([("reward_collapse", 1.0)]).before("a", [{"chosen_ids": 1}]) is None


def test_a_loss_spike_and_a_reward_collapse_are_recorded_and_replayed(tiny, tmp_path):
    """Steps 1-6 train on the same scale of advantages; step 7's are 1000 times larger: its
    loss and grad norm spike, `spike:4` records step 7 only, and it replays bit-exactly.
    `reward_collapse:3` with every row's reward 1.0 until step 7's 0.0 records step 7 only."""
    recorder = _run(tiny, tmp_path / "spike", "nonfinite+spike:4", 7, scale={7: 1000.0})
    assert [s for s, *_ in recorder.written] == [7]
    result = replay(tmp_path / "spike" / "step-7")
    assert result.record.trigger.startswith("spike:4 (actor/")
    assert result.bit_exact, result.differences()

    recorder = _run(tiny, tmp_path / "reward", "reward_collapse:3", 7, rewards={7: 0.0})
    assert [s for s, *_ in recorder.written] == [7]
    result = replay(tmp_path / "reward" / "step-7")
    assert result.record.trigger.startswith("reward_collapse:3 (mean reward 0, previous 20")
    assert result.bit_exact, result.differences()


@pytest.mark.slow
@pytest.mark.xdist_group("dist")
@pytest.mark.parametrize("strategy", ["fsdp2_train", "deepspeed_train"])
def test_a_two_rank_step_replays_bit_exactly_in_two_gloo_processes(tmp_path, strategy):
    """A role of 2 gloo ranks (FSDP2, DeepSpeed's default ZeRO stage) records step 2 (each
    rank's rows and RNG state, the sharded checkpoint); rl-replay replays it in 2 processes to
    the same metrics and weights."""
    from replay_ranks import record_two_steps

    from rl_rollout.tiny_model import build_tiny_model
    from rl_train.dist import spawn

    model = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_heads=1, intermediate_size=64)
    root = tmp_path / "records"
    spawn(record_two_steps, 2, str(model), str(root), strategy, env={"OMP_NUM_THREADS": "1"})
    result = replay(root / "step-2")
    assert result.record.trainer.world_size == 2
    assert result.record.trainer.strategy_name == strategy
    assert sorted(result.record.files) == ["rank0.safetensors", "rank1.safetensors"]
    assert result.record.metric_values()["actor/optimizer_steps"] == 1.0
    assert result.bit_exact, result.differences()
