"""rl_rollout.lean_decode: a decode step equals transformers' forward (logits and KV cache) on
Qwen2, Llama and Mistral layouts; the fused weights follow every write to the model; models it
does not cover keep transformers' forward, and the engine option is checked."""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path

import pytest
import torch

from rl_config.records import GenerationRequest, SamplingParams
from rl_rollout.hf_engine import HFEngine, _new_cache, hf_option_problems
from rl_rollout.lean_decode import LeanDecoder, lean_decode_problem


def _config(kind: str, **overrides):
    """A tiny config of ``kind`` with grouped-query attention (4 query, 2 KV heads)."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common: dict[str, object] = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
    )
    classes = {"qwen2": Qwen2Config, "llama": LlamaConfig, "mistral": MistralConfig}
    classes["qwen3"] = Qwen3Config
    classes["device"] = Qwen2Config  # moved off the CPU by the test
    if kind == "mistral":
        common["sliding_window"] = None
    return classes[kind](**{**common, **overrides})


def _model(config, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # biases start at zero: make them count
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.5)
    return model


def _prefill(model, rows: list[list[int]]):
    """A left-padded prefill of ``rows`` as the engine runs it: (cache, mask [B, L])."""
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, tokens in enumerate(rows):
        ids[i, width - len(tokens) :] = torch.tensor(tokens)
        mask[i, width - len(tokens) :] = 1
    cache = _new_cache(model.config)
    with torch.inference_mode():
        model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            past_key_values=cache,
            use_cache=True,
        )
    return cache, mask


CASES = {
    "qwen2 (q/k/v biases, tied)": ("qwen2", {"tie_word_embeddings": True}),
    "llama (no biases, untied)": ("llama", {"tie_word_embeddings": False}),
    "llama (attention and mlp biases, llama3 rope)": (
        "llama",
        {
            "attention_bias": True,
            "mlp_bias": True,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "mistral": ("mistral", {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_decode_steps_equal_transformers_forward(case: str) -> None:
    """Twenty decode steps of a left-padded batch: the lean step's logits and the KV columns it
    appends equal transformers' forward on an untouched copy of the model."""
    kind, overrides = CASES[case]
    config = _config(kind, **overrides)
    reference, model = _model(config), _model(config)
    assert lean_decode_problem(model) is None
    lean = LeanDecoder(model)
    rows = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    ref_cache, ref_mask = _prefill(reference, rows)
    cache, _ = _prefill(model, rows)  # transformers' forward over the re-pointed weights
    for a, b in zip(ref_cache.layers, cache.layers):
        assert torch.allclose(a.keys, b.keys, atol=1e-6)
    tokens = torch.tensor([3, 4, 5])
    positions = torch.tensor([len(r) for r in rows])
    for _ in range(20):
        ref_mask = torch.cat([ref_mask, torch.ones((3, 1), dtype=ref_mask.dtype)], dim=1)
        with torch.inference_mode():
            expected = reference(
                input_ids=tokens[:, None],
                attention_mask=ref_mask.bool()[:, None, None, :],
                position_ids=positions[:, None],
                past_key_values=ref_cache,
                use_cache=True,
            ).logits[:, -1]
        logits = lean.step(tokens, positions, ref_mask.bool(), cache)
        torch.testing.assert_close(logits, expected, atol=2e-5, rtol=1e-5)
        tokens, positions = expected.argmax(-1), positions + 1
    for a, b in zip(ref_cache.layers, cache.layers):
        torch.testing.assert_close(b.keys, a.keys, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(b.values, a.values, atol=2e-5, rtol=1e-5)
    assert lean.fusions == 1


def test_fused_weights_follow_writes_and_replacements() -> None:
    """A write into the model's parameters (update_weights' copy_) lands in the fused buffers;
    parameters replaced by ``model.to_empty`` + new values are fused again before the next step."""
    config = _config("qwen2")
    model = _model(config, seed=0)
    lean = LeanDecoder(model)
    new = _model(config, seed=1)

    def step_logits(m):
        cache, mask = _prefill(m, [[5, 6, 7]])
        mask = torch.cat([mask, torch.ones((1, 1), dtype=mask.dtype)], dim=1)
        return cache, mask

    with torch.no_grad():
        for name, param in model.state_dict(keep_vars=True).items():
            param.copy_(new.state_dict()[name])
    cache, mask = step_logits(new)
    cache_lean, _ = step_logits(model)
    with torch.inference_mode():
        expected = new(
            input_ids=torch.tensor([[8]]),
            attention_mask=mask.bool()[:, None, None, :],
            position_ids=torch.tensor([[3]]),
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1]
    got = lean.step(torch.tensor([8]), torch.tensor([3]), mask.bool(), cache_lean)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)
    assert lean.fusions == 1  # written in place: still the same buffers

    # what sleep(2) + wake_up + update_weights do: new, separate storage, then written
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    model.to_empty(device="cpu")
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
        model.tie_weights()
        for name, param in model.state_dict(keep_vars=True).items():
            param.copy_(new.state_dict()[name])
    cache_lean, _ = step_logits(model)
    got = lean.step(torch.tensor([8]), torch.tensor([3]), mask.bool(), cache_lean)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)
    assert lean.fusions == 2
    attn = model.get_decoder().layers[0].self_attn
    assert attn.k_proj.weight.untyped_storage().data_ptr() == (
        attn.q_proj.weight.untyped_storage().data_ptr()
    )


@pytest.mark.parametrize(
    ("kind", "overrides", "why"),
    [
        ("qwen3", {}, "model_type 'qwen3'"),
        ("llama", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        (
            "qwen2",
            {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0},
            "sliding-window",
        ),
        ("mistral", {"sliding_window": 16}, "sliding-window"),
        ("device", {}, "device meta"),
    ],
)
def test_models_it_does_not_cover_are_named(kind, overrides, why) -> None:
    model = _model(_config(kind, **overrides))
    if kind == "device":
        model = _model(_config("qwen2")).to("meta")
    problem = lean_decode_problem(model)
    assert problem is not None and why in problem
    with pytest.raises(ValueError, match="LeanDecoder cannot run this model"):
        LeanDecoder(model)


def _generate(engine: HFEngine, prompts: list[list[int]], tokens: int = 24):
    requests = [
        GenerationRequest(
            request_id=f"r{i}",
            prompt_ids=p,
            sampling=SamplingParams(max_new_tokens=tokens, ignore_eos=True, seed=i, n=2),
        )
        for i, p in enumerate(prompts)
    ]
    return asyncio.run(engine.generate(requests))


def test_engine_decodes_through_it_by_default_and_equals_transformers(tiny_model_dir) -> None:
    """The same seeded requests through the lean path and through transformers' forward: the
    same tokens, log-probs within float noise; `lean_decode: false` really turns it off."""
    prompts = [list(range(20, 31)), [40, 41], list(range(50, 56))]
    results = {}
    for lean in (True, False):
        engine = HFEngine(tiny_model_dir, {"max_num_seqs": 8, "lean_decode": lean}, seed=0)
        try:
            results[lean] = _generate(engine, prompts)
            steps = engine.stats["lean_decode_steps"]
            assert (steps == engine.stats["decode_steps"] > 0) if lean else steps == 0
            assert engine.lean_decode_problem == (None if lean else "turned off")
        finally:
            engine.shutdown()
    for a, b in zip(results[True], results[False]):
        assert a.output_ids == b.output_ids
        diff = max(abs(x - y) for x, y in zip(a.output_log_probs, b.output_log_probs))
        assert diff < 1e-5


def test_engine_on_a_model_it_does_not_cover(tmp_path: Path) -> None:
    """A Qwen3 model decodes through transformers' forward; `lean_decode: true` set explicitly
    warns that it has no effect, naming why."""
    model_dir = tmp_path / "qwen3"
    _model(_config("qwen3")).save_pretrained(model_dir)
    with pytest.warns(UserWarning, match="lean_decode: true has no effect.*qwen3"):
        engine = HFEngine(model_dir, {"max_num_seqs": 4, "lean_decode": True}, seed=0)
    try:
        results = _generate(engine, [[5, 6, 7]], tokens=5)
        assert [len(r.output_ids) for r in results] == [5, 5]
        assert engine.stats["lean_decode_steps"] == 0 and engine.stats["decode_steps"] > 0
    finally:
        engine.shutdown()
    with warnings.catch_warnings():  # the default does not warn
        warnings.simplefilter("error")
        HFEngine(model_dir, {"max_num_seqs": 4}, seed=0).shutdown()


def test_lean_decode_option_is_a_bool() -> None:
    assert hf_option_problems({"lean_decode": False}) == {}
    problems = hf_option_problems({"lean_decode": "yes", "lean_decod": True})
    assert "must be true or false" in problems["lean_decode"]
    assert "did you mean 'lean_decode'" in problems["lean_decod"]
