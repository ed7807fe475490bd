"""Adapter-only weight sync (rl_sync.adapter): a LoRA trainer sends its adapter factors, the HF
engine merges them into the base weights it loaded, and then holds exactly the trainer's merged
model (bit for bit, every update merged from the base, never from the last merge) and samples
with the trained model's log-probs."""

from __future__ import annotations

import asyncio

import pytest
import torch

import rl_train
from rl_train.testing import make_batch, nll_loss


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    from rl_rollout.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("lora_sync") / "model"))


def _payload(backend) -> list[tuple[str, torch.Tensor]]:
    return [(n, t.clone()) for b in backend.iter_adapter_buckets(1 << 20) for n, t in b]


def test_adapter_only_sync_into_hf_engine_holds_the_trained_model(tiny):
    from rl_config.records import GenerationRequest, SamplingParams
    from rl_rollout.hf_engine import HFEngine

    torch.set_num_threads(1)
    trainer = rl_train.build_backend(
        "hf_infer",
        role="actor",
        model_path=tiny,
        training_args=dict(per_device_train_batch_size=4, learning_rate=1e-2),
        model_args={"lora_target": "all-linear", "lora_rank": 2, "lora_alpha": 6},
    )
    engine = HFEngine(tiny, dtype="float32", device="cpu", seed=0)
    full_bytes = sum(
        t.numel() * t.element_size() for _n, t in engine.state_dict_for_check().items()
    )
    try:
        for version in (1, 2):
            trainer.train_step(make_batch(4, 16, seed=version), nll_loss)
            payload = _payload(trainer)
            assert all(n.endswith((".lora_A.weight", ".lora_B.weight")) for n, _t in payload)
            engine.update_weights(payload, version)
            merged = {n: t for b in trainer.iter_full_tensor_buckets(1 << 20) for n, t in b}
            held = engine.state_dict_for_check()
            assert engine.weight_version == version
            for name, tensor in merged.items():
                assert torch.equal(held[name], tensor), name
        # rank 2 on every linear layer: r (in + out) per module instead of in x out
        sent = sum(t.numel() * t.element_size() for _n, t in payload)
        config = trainer.hf_config
        h, m = config.hidden_size, config.intermediate_size
        kv = config.num_key_value_heads * (h // config.num_attention_heads)
        per_layer = 2 * (2 * (h + h) + 2 * (h + kv) + 3 * (h + m))  # q o, k v, gate up down
        assert sent == per_layer * config.num_hidden_layers * 4  # float32
        assert sent < full_bytes / 20
        prompt = [3, 17, 42, 9, 5]
        request = GenerationRequest(
            request_id="r0",
            prompt_ids=prompt,
            sampling=SamplingParams(max_new_tokens=6, seed=7, ignore_eos=True),
        )
        (result,) = asyncio.run(engine.generate([request]))
    finally:
        engine.shutdown()
    ids = torch.tensor([prompt + list(result.output_ids)])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    out = trainer.forward(batch).log_probs
    assert out is not None
    want = out[0, len(prompt) :]
    torch.testing.assert_close(torch.tensor(result.output_log_probs), want, atol=1e-4, rtol=1e-4)
    base = trainer.forward_base(batch).log_probs
    assert base is not None and (base[0, len(prompt) :] - want).abs().max() > 1e-3


def test_an_adapter_for_a_missing_weight_is_refused_naming_it(tiny):
    from rl_rollout.hf_engine import HFEngine

    engine = HFEngine(tiny, dtype="float32", device="cpu", seed=0)
    try:
        bad = [("model.layers.0.self_attn.nope.lora_A.weight", torch.zeros(2, 4))]
        with pytest.raises(KeyError, match="nope"):
            engine.update_weights(bad, 1)
        a, b = torch.zeros(2, 3), torch.zeros(2, 2)  # in 3 does not fit the projection
        wrong = [
            ("model.layers.0.self_attn.q_proj.lora_A.weight", a),
            ("model.layers.0.self_attn.q_proj.lora_B.weight", b),
        ]
        with pytest.raises(ValueError, match="q_proj.*do not fit"):
            engine.update_weights(wrong, 1)
        assert engine.weight_version == 0
    finally:
        engine.shutdown()
