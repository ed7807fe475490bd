"""LoRA under DeepSpeed ZeRO-3 on 2 gloo ranks, end to end through a run checkpoint: the
adapter-disabled forward is the frozen base model (the reference for free), and `rl-export`
writes the trained model both as a peft adapter directory (`--adapter`) and merged."""

from __future__ import annotations

import shutil

import pytest
import torch

from rl_runtime.cli.export import MODEL_PATH_KEY, main
from rl_runtime.state.checkpoint import RunCheckpoints, RunState
from rl_train.dist import spawn
from rl_train.testing import train_worker

LORA = {"lora_target": "all-linear", "lora_rank": 4, "lora_alpha": 8}


def _token_log_probs(model, batch: dict) -> torch.Tensor:
    from rl_train.modeling import token_outputs

    with torch.no_grad():
        out = token_outputs(model.eval(), batch, role="actor").log_probs
    assert out is not None
    return out


@pytest.mark.slow
@pytest.mark.xdist_group("dist")
def test_zero3_lora_base_log_probs_and_adapter_export(tmp_path):
    """Each rank's log-probs with the adapter disabled are the frozen base model's, and the
    adapter is on again after; the run checkpoint exports (`rl-export --adapter`) as a peft
    adapter directory that peft loads on the base model and (`rl-export`) as the merged model,
    both reproducing the trained model's log-probs."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rl_rollout.tiny_model import build_tiny_model

    tiny = str(build_tiny_model(tmp_path / "tiny"))
    train, role_root = tmp_path / "train", tmp_path / "role"
    train.mkdir()
    args = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1,
            "learning_rate": 1e-2, "max_steps": 4}  # fmt: skip
    spec = dict(strategy="deepspeed_train", steps=2, out=str(train), batch={"n": 4, "max_len": 16},
                save_at=2, ckpt_root=str(role_root), forward_check=True,
                kwargs=dict(role="actor", model_path=tiny, model_args=LORA, training_args=args,
                            strategy_config={"zero_optimization": {"stage": 3}}))  # fmt: skip
    spawn(train_worker, 2, spec, env={"OMP_NUM_THREADS": "1"})
    state = RunState(step=2, weight_version=2, env_seed_epoch=2, extra={MODEL_PATH_KEY: tiny})
    run = RunCheckpoints(tmp_path / "checkpoints").save_run(
        state, lambda d: shutil.copytree(role_root, d / "actor_train")
    )
    assert main([str(run), str(tmp_path / "adapter"), "--adapter"]) == 0
    assert main([str(run), str(tmp_path / "merged")]) == 0

    def load_base():
        return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)

    base = load_base()
    adapted = PeftModel.from_pretrained(load_base(), str(tmp_path / "adapter"))
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32)
    for rank in range(2):
        seen = torch.load(train / f"forward_rank{rank}.pt", weights_only=True)
        rows = seen["rows"]
        batch = {"input_ids": rows, "attention_mask": (rows != 0).long()}
        torch.testing.assert_close(seen["base_log_probs"], _token_log_probs(base, batch),
                                   atol=1e-5, rtol=0)  # fmt: skip
        assert torch.equal(seen["log_probs_after_base"], seen["log_probs"])
        trained = seen["log_probs"]
        assert (trained - seen["base_log_probs"]).abs().max() > 1e-3
        torch.testing.assert_close(_token_log_probs(adapted, batch), trained, atol=1e-5, rtol=0)
        torch.testing.assert_close(_token_log_probs(merged, batch), trained, atol=1e-5, rtol=0)
