"""rl-export: a run's checkpoint -> an HF model directory. Real 2-rank gloo training (FSDP2,
DeepSpeed ZeRO-2 and ZeRO-3) saves a checkpoint, a run checkpoint holds it, the exported model
loads with AutoModelForCausalLM and reproduces the trained model's log-probs; a tampered or
unsigned checkpoint is refused before anything in it is read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from rl_runtime.cli.export import MODEL_PATH_KEY, main
from rl_runtime.state.checkpoint import RunCheckpoints, RunState
from rl_train.dist import spawn
from rl_train.testing import make_batch, train_worker

BATCH = {"n": 4, "max_len": 16}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from rl_rollout.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("export_tiny") / "model"))


def _spec(out: Path, model: str, strategy: str, cfg: dict, **extra) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    args = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1,
            "learning_rate": 1e-2, "max_steps": 4}  # fmt: skip
    return dict(strategy=strategy, steps=extra.pop("steps", 2), out=str(out), batch=BATCH,
                kwargs=dict(role="actor", model_path=model, strategy_config=cfg,
                            training_args=args), **extra)  # fmt: skip


def _log_probs(model_dir: Path) -> torch.Tensor:
    """Per-token log-probs `[B, T-1]` of the test batch under the HF model in `model_dir`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    batch = make_batch(**BATCH)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, batch["input_ids"][:, 1:, None])[..., 0] * batch["attention_mask"][:, 1:]


def _run_checkpoint(tmp_path: Path, role_root: Path, model: str) -> Path:
    """A run's checkpoint (signed) holding the role's checkpoints, as the Runner saves one."""
    state = RunState(step=2, weight_version=2, env_seed_epoch=2, extra={MODEL_PATH_KEY: model})
    manager = RunCheckpoints(tmp_path / "checkpoints")
    return manager.save_run(state, lambda d: shutil.copytree(role_root, d / "actor_train"))


@pytest.mark.slow
@pytest.mark.xdist_group("dist")
@pytest.mark.parametrize(
    ("strategy", "cfg"),
    [
        ("fsdp2_train", {}),
        ("deepspeed_train", {"zero_optimization": {"stage": 2, "overlap_comm": False}}),
        ("deepspeed_train", {"zero_optimization": {"stage": 3}}),
    ],
    ids=["fsdp2", "zero2", "zero3"],
)
def test_an_exported_checkpoint_reproduces_the_trained_models_log_probs(
    tmp_path, tiny_model, strategy, cfg
):
    role_root = tmp_path / "role"
    trained = tmp_path / "trained"
    spec = _spec(tmp_path / "train", tiny_model, strategy, cfg, save_at=2,
                 ckpt_root=str(role_root), export_dir=str(trained))  # fmt: skip
    spawn(train_worker, 2, spec, env={"OMP_NUM_THREADS": "1"})
    run = _run_checkpoint(tmp_path, role_root, tiny_model)
    out = tmp_path / "hf"
    assert main([str(run.parent), str(out)]) == 0  # the newest run checkpoint there
    for name in ("config.json", "model.safetensors", "tokenizer_config.json"):
        assert (out / name).is_file(), name
    exported, reference = _log_probs(out), _log_probs(trained)  # the trainer's own HF export
    torch.testing.assert_close(exported, reference, atol=1e-5, rtol=1e-5)
    assert (exported - _log_probs(Path(tiny_model))).abs().max() > 1e-3  # trained, not the base


def test_a_tampered_or_unsigned_checkpoint_is_refused_before_it_is_read(tmp_path, capsys):
    root = tmp_path / "role"
    step = root / "step-000002"
    (step / "model_optim").mkdir(parents=True)
    (step / "model_optim" / ".metadata").write_bytes(b"not a pickle this project signed")
    (step / "COMMITTED").write_text('{"step": 2}')
    assert main([str(step), str(tmp_path / "hf"), "--base-model", str(tmp_path)]) == 1
    assert "checkpoint error:" in capsys.readouterr().err  # no manifest: nothing was unpickled
    run = _run_checkpoint(tmp_path, root, str(tmp_path))
    (run / "actor_train" / "step-000002" / "model_optim" / ".metadata").write_bytes(b"x")
    assert main([str(run), str(tmp_path / "hf")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("checkpoint error:") and "step-000002" in err
    assert not (tmp_path / "hf").exists()


def test_the_runs_model_config_override_is_in_the_exported_config(tmp_path, tiny_model):
    """A run trained with model_args.model_config_kwargs: its checkpoint records them, and the
    config.json rl-export writes carries them (the trainer's own export does too)."""
    import json

    import rl_train
    from rl_runtime.cli.export import MODEL_CONFIG_KEY

    override = {"max_position_embeddings": 77}
    backend = rl_train.build_backend("hf_infer", role="actor", model_path=tiny_model,
                                     training_args={"per_device_train_batch_size": 4},
                                     model_args={"model_config_kwargs": override})  # fmt: skip
    backend.save_checkpoint(tmp_path / "role", 2)
    state = RunState(step=2, weight_version=2, env_seed_epoch=2,
                     extra={MODEL_PATH_KEY: tiny_model, MODEL_CONFIG_KEY: {"actor_train": override}})  # fmt: skip
    run = RunCheckpoints(tmp_path / "checkpoints").save_run(
        state, lambda d: shutil.copytree(tmp_path / "role", d / "actor_train")
    )
    assert main([str(run), str(tmp_path / "hf")]) == 0
    assert (
        json.loads((tmp_path / "hf" / "config.json").read_text())["max_position_embeddings"] == 77
    )
