"""model_args.model_config_kwargs: the trainer's model is built with the overridden HF config
(actor and critic), the live export and the checkpoint export write it to config.json, and a
name the config does not have is an error naming it before anything loads."""

import json

import pytest

import rl_train
from rl_train.testing import make_batch, nll_loss

TARGS = dict(per_device_train_batch_size=4, gradient_accumulation_steps=1, learning_rate=1e-2)
OVERRIDE = {"max_position_embeddings": 77}


def _backend(path, role="actor", overrides=OVERRIDE):
    return rl_train.build_backend(
        "hf_infer",
        role=role,
        model_path=path,
        training_args=TARGS,
        model_args={"model_config_kwargs": overrides},
    )


def test_the_trainers_model_and_its_exports_carry_the_override(tiny_model_path, tmp_path):
    from transformers import AutoConfig

    from rl_train.checkpoint_export import checkpoint_weights, export_weights

    base = AutoConfig.from_pretrained(tiny_model_path)
    assert base.max_position_embeddings != 77
    backend = _backend(tiny_model_path)
    assert backend.model.config.max_position_embeddings == 77
    backend.train_step(make_batch(4, 16, seed=3), nll_loss)
    live = json.loads((backend.export_hf(tmp_path / "live") / "config.json").read_text())
    ckpt = backend.save_checkpoint(tmp_path / "ckpt", 1)
    offline = export_weights(
        checkpoint_weights(ckpt), tiny_model_path, tmp_path / "out", config_overrides=OVERRIDE
    )
    for written in (live, json.loads((offline / "config.json").read_text())):
        assert written["max_position_embeddings"] == 77
    critic = _backend(tiny_model_path, role="critic")
    assert critic.model.config.max_position_embeddings == 77


def test_an_unknown_config_attribute_is_an_error_naming_it(tiny_model_path):
    with pytest.raises(ValueError, match=r"model_config_kwargs\.max_postion_embeddings: not an"):
        _backend(tiny_model_path, overrides={"max_postion_embeddings": 77})
