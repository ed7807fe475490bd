"""TrainWorker: the supervised warm-up pass is one epoch, whatever ppo_epochs says."""

from __future__ import annotations

from rl_rollout.tiny_model import build_tiny_model
from rl_runtime.workers import TrainWorker
from rl_train.args import TrainingArgs
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
