"""TrainWorker: the supervised warm-up pass is one epoch, whatever ppo_epochs says."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_rollout.tiny_model import build_tiny_model
from rl_runtime.cluster.workers import TrainWorker
from rl_train.args import LogprobSampling, TrainingArgs
from rl_train.testing import make_batch, nll_loss


def test_sft_warm_up_is_one_pass_whatever_ppo_epochs_says(tmp_path):
    model = build_tiny_model(tmp_path / "tiny", seed=0)
    worker = TrainWorker(
        rank=0,
        world_size=1,
        dist_env={},
        role="actor",
        model_path=str(model),
        strategy_name="hf_infer",
        training_args=TrainingArgs(
            per_device_train_batch_size=4, gradient_accumulation_steps=1, ppo_epochs=3
        ),
    )
    batch = make_batch(8, 12, vocab=1000)
    assert worker.train_step(dict(batch), "sft")["actor/optimizer_steps"] == 2.0  # 8 rows / 4
    # the same batch through the backend's loop keeps ppo_epochs: 3 passes x 2 mini-batches
    assert worker.backend.train_step(dict(batch), nll_loss)["actor/optimizer_steps"] == 6.0


def test_sft_warm_up_fits_the_raw_model_whatever_the_sampling_temperature(tmp_path):
    """The warm-up's NLL is of softmax(logits) (temperature 1) while the trainer's RL log-probs
    are of the sampling distribution (`logprob_sampling`: temperature 0.5, top-k 5): the forward's
    log-probs."""
    import torch

    model = build_tiny_model(tmp_path / "tiny", seed=0)

    def worker(sampling: LogprobSampling) -> TrainWorker:
        return TrainWorker(rank=0, world_size=1, dist_env={}, role="actor",
                           model_path=str(model), strategy_name="hf_infer",
                           training_args=TrainingArgs(per_device_train_batch_size=8,
                                                      learning_rate=0.0,
                                                      logprob_sampling=sampling))  # fmt: skip

    batch = make_batch(8, 12, vocab=1000)
    at_half, at_one = worker(LogprobSampling(0.5, top_k=5)), worker(LogprobSampling())
    nll = [w.train_step(dict(batch), "sft")["actor/sft_nll"] for w in (at_half, at_one)]
    assert nll[0] == pytest.approx(nll[1], rel=1e-6)
    half, one = (w.backend.forward(dict(batch)).log_probs for w in (at_half, at_one))
    assert half is not None and one is not None
    assert (half - one).abs().max() > 1e-2  # the policy's are at 0.5
    assert torch.isfinite(half).all()


def _cosine_worker(model: str) -> TrainWorker:
    return TrainWorker(
        rank=0,
        world_size=1,
        dist_env={},
        role="actor",
        model_path=model,
        strategy_name="hf_infer",
        training_args=TrainingArgs(
            per_device_train_batch_size=4,
            gradient_accumulation_steps=1,
            learning_rate=1e-3,
            lr_scheduler_type="cosine",
            warmup_steps=2,
            max_steps=6,
        ),
    )


def _rates_of_steps(worker: TrainWorker, steps: int, loss: str = "default") -> list[float]:
    """The learning rate each of `steps` one-optimizer-step train_steps runs at."""
    rates = []
    for i in range(steps):
        rates.append(worker.backend.optimizer.param_groups[0]["lr"])  # type: ignore[attr-defined]
        batch = make_batch(4, 12, vocab=1000, seed=i)
        if loss == "default":
            worker.backend.train_step(dict(batch), nll_loss)
        else:
            worker.train_step(dict(batch), loss)
    return rates


def test_supervised_warm_up_holds_its_rate_and_leaves_the_schedule_to_rl(tmp_path):
    """A warm-up at a held rate neither follows nor uses up the configured schedule: after
    `restart_schedule`, RL's steps run at a fresh worker's rates (warm-up ramp, cosine decay),
    from fresh Adam moments."""
    model = str(build_tiny_model(tmp_path / "tiny", seed=0))
    fresh = _rates_of_steps(_cosine_worker(model), 6)
    assert fresh[:3] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3])  # warm-up ramp, then decay
    assert fresh[3] < fresh[2] and fresh[5] < fresh[4]

    worker = _cosine_worker(model)
    assert worker.hold_learning_rate(5e-3) == 5e-3
    assert _rates_of_steps(worker, 4, "sft") == [5e-3] * 4
    assert worker.backend.optimizer.state  # type: ignore[attr-defined]
    assert worker.restart_schedule() == pytest.approx(1e-3 / 3)
    assert not worker.backend.optimizer.state  # type: ignore[attr-defined]
    assert _rates_of_steps(worker, 6) == pytest.approx(fresh)


def test_held_rate_defaults_to_the_configured_one(tmp_path):
    worker = _cosine_worker(str(build_tiny_model(tmp_path / "tiny", seed=0)))
    assert worker.hold_learning_rate() == 1e-3  # not the schedule's first, ramped rate
    assert _rates_of_steps(worker, 3, "sft") == [1e-3] * 3


def test_a_checkpoint_saved_right_after_the_warm_up_resumes(tmp_path):
    """Saved after `restart_schedule` and before any RL optimizer step (dynamic sampling kept no
    group), the checkpoint holds no optimizer state; a fresh worker resumes from it and trains
    as the uninterrupted one does. `restart_schedule` drops the warm-up's gradients too."""
    import torch

    model = str(build_tiny_model(tmp_path / "tiny", seed=0))

    def warmed_up() -> TrainWorker:
        worker = _cosine_worker(model)
        worker.hold_learning_rate(5e-3)
        _rates_of_steps(worker, 2, "sft")
        worker.restart_schedule()
        assert all(p.grad is None for p in worker.backend.model.parameters())  # type: ignore[attr-defined]
        return worker

    def rl_steps(worker: TrainWorker) -> dict[str, torch.Tensor]:
        _rates_of_steps(worker, 2)
        return dict(worker.named_tensors())

    uninterrupted = rl_steps(warmed_up())
    saved = warmed_up()
    saved.save_checkpoint(str(tmp_path / "ckpt"), 0)
    resumed = _cosine_worker(model)
    assert resumed.load_checkpoint(str(tmp_path / "ckpt")) == (0, {})
    for trained in (rl_steps(saved), rl_steps(resumed)):
        assert all(torch.equal(trained[k], uninterrupted[k]) for k in uninterrupted)


def test_a_reference_adopts_another_models_weights_and_forgets_its_own(tmp_path):
    """`adopt_weights`: a reference worker built from one model takes a trained actor's weights
    (another model's `named_tensors`): its log-probs are then the actor's, to the bit, not those of
    the model it was built from; `reload` from an exported directory does the same; shutdown
    removes the directory the adopted weights were written to."""
    import torch

    def worker(path: Path, role: str) -> TrainWorker:
        return TrainWorker(rank=0, world_size=1, dist_env={}, role=role, model_path=str(path),
                           strategy_name="hf_infer",
                           training_args=TrainingArgs(per_device_train_batch_size=4))  # fmt: skip

    actor = worker(build_tiny_model(tmp_path / "actor", seed=1), "actor")
    reference = worker(build_tiny_model(tmp_path / "pretrain", seed=0), "reference")
    batch = make_batch(4, 12, vocab=1000)
    actor.train_step(dict(batch), "sft")  # the actor moves away from where it was built

    def log_probs(w: TrainWorker) -> torch.Tensor:
        return w.forward(dict(batch))["log_probs"]

    before = log_probs(reference)
    assert not torch.equal(before, log_probs(actor))
    reference.adopt_weights(actor.named_tensors())
    assert torch.equal(log_probs(reference), log_probs(actor))
    adopted = reference._adopted_dir
    assert adopted is not None and Path(adopted).is_dir()

    exported = Path(reference.export_hf(str(tmp_path / "ckpt" / "reference")))
    other = worker(tmp_path / "pretrain", "reference")
    assert torch.equal(log_probs(other), before)
    other.reload(str(exported))
    assert torch.equal(log_probs(other), log_probs(actor))
    reference.shutdown()
    assert not Path(adopted).exists()
