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


def _lora_trainer(tiny: str, rank: int = 2):
    torch.set_num_threads(1)
    return rl_train.build_backend(
        "hf_infer",
        role="actor",
        model_path=tiny,
        training_args=dict(per_device_train_batch_size=4, learning_rate=1e-2),
        model_args={"lora_target": "all-linear", "lora_rank": rank, "lora_alpha": 6},
    )


def test_an_adapter_payload_is_the_peft_adapter_vllm_loads(tiny, tmp_path):
    """What VLLMEngine hands vLLM for an adapter-only update (rl_rollout.vllm_lora): a peft
    adapter directory (scale in B, lora_alpha = r) that peft loads on the base model and that
    computes the trainer's model; mixed, misshapen or too-large payloads are refused by name."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rl_rollout.vllm_lora import is_adapter_payload, vllm_max_lora_rank, write_adapter_dir
    from rl_train.modeling import token_outputs

    trainer = _lora_trainer(tiny)
    trainer.train_step(make_batch(4, 16, seed=1), nll_loss)
    payload = dict(_payload(trainer))
    assert is_adapter_payload(payload, lora_enabled=True)
    out = write_adapter_dir(payload, tmp_path / "a", tiny, max_rank=8)
    base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(out)).eval()
    batch = make_batch(6, 16, seed=5)
    with torch.no_grad():
        got = token_outputs(model, batch, role="actor").log_probs
    want = trainer.forward(batch).log_probs
    assert want is not None
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert (want - trainer.forward_base(batch).log_probs).abs().max() > 1e-3
    full = [("model.norm.weight", torch.ones(4))]
    assert not is_adapter_payload(dict(full), lora_enabled=False)
    with pytest.raises(ValueError, match="strategy_config.enable_lora: true"):
        is_adapter_payload(payload, lora_enabled=False)
    with pytest.raises(ValueError, match="mixed with full weights"):
        is_adapter_payload({**payload, **dict(full)}, lora_enabled=True)
    with pytest.raises(ValueError, match=r"rank 2 exceeds .* max_lora_rank 1 .*max_lora_rank: 8"):
        write_adapter_dir(payload, tmp_path / "b", tiny, max_rank=1)
    one = {k: v for k, v in payload.items() if "lora_A" in k}
    with pytest.raises(ValueError, match="lacks a factor"):
        write_adapter_dir(one, tmp_path / "c", tiny, max_rank=8)
    assert [vllm_max_lora_rank(r) for r in (1, 2, 8, 9, 40, 512)] == [1, 8, 8, 16, 64, 512]
    with pytest.raises(ValueError, match="exceeds vLLM's largest"):
        vllm_max_lora_rank(513)


@pytest.fixture(scope="module")
def vllm_tiny(tmp_path_factory) -> str:
    from rl_rollout.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("lora_vllm") / "model", seed=0))


@pytest.mark.vllm
def test_vllm_loads_the_adapter_by_request_and_samples_the_trained_model(vllm_tiny):
    """vLLM started with enable_lora takes adapter-only updates as LoRA requests: after each
    (versions 1, 2: the second replaces the first) its sampled tokens' log-probs are the LoRA
    trainer's model's, not the base model's; a full update then drops the adapter."""
    pytest.importorskip("vllm")
    from rl_config.records import GenerationRequest, SamplingParams
    from rl_rollout.vllm_engine import VLLMEngine

    trainer = _lora_trainer(vllm_tiny)
    engine = VLLMEngine(
        vllm_tiny,
        {"max_model_len": 256, "max_num_seqs": 4, "enable_lora": True, "max_lora_rank": 8},
        dtype="float32",
        seed=0,
    )
    prompt = [3, 17, 42, 9, 5]

    def sample(tag: str) -> tuple[torch.Tensor, dict]:
        request = GenerationRequest(
            request_id=tag,
            prompt_ids=prompt,
            sampling=SamplingParams(max_new_tokens=6, seed=7, ignore_eos=True),
        )
        (result,) = asyncio.run(engine.generate([request]))
        ids = torch.tensor([prompt + list(result.output_ids)])
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        return torch.tensor(result.output_log_probs), batch

    try:
        for version in (1, 2):
            trainer.train_step(make_batch(4, 16, seed=version), nll_loss)
            engine.update_weights(_payload(trainer), version)
            assert engine.weight_version == version
            got, batch = sample(f"v{version}")
            want = _response(trainer.forward(batch), len(prompt))
            base = _response(trainer.forward_base(batch), len(prompt))
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
            assert (base - want).abs().max() > 1e-3
        assert engine._lora.lora_int_id == 2
        assert _loras(engine) == {2}  # version 1's adapter was removed
        merged = [(n, t) for b in trainer.iter_full_tensor_buckets(1 << 20) for n, t in b]
        engine.update_weights(merged, 3)  # full weights: the adapter is dropped
        got, batch = sample("v3")
        want = _response(trainer.forward(batch), len(prompt))
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert engine._lora is None and _loras(engine) == set()
    finally:
        engine.shutdown()
    assert engine._lora_root is not None and not engine._lora_root.exists()


def _response(out, prompt_len: int) -> torch.Tensor:
    """The response tokens' log-probs `[T_response]` of a one-row forward."""
    assert out.log_probs is not None
    return out.log_probs[0, prompt_len:]


def _loras(engine) -> set[int]:
    """The adapter ids vLLM holds."""
    return set(engine._call(engine.llm.list_loras(), "vLLM list_loras"))
