"""HFEngine specifics: continuous batching, prefix reuse, sampling math, config errors, registry."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from rl_config.records import GenerationRequest, SamplingParams
from rl_rollout import build_engine, list_engines, register_engine
from rl_rollout.engine import EngineAsleepError
from rl_rollout.hf_engine import HFEngine
from rl_rollout.sampling import warp_logits


def _teacher_forced(model, prompt, output):
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0].float(), -1)
    return lp[torch.arange(len(prompt) - 1, len(prompt) + len(output) - 1), torch.tensor(output)]


@pytest.fixture()
def fresh_engine(tiny_model_dir):
    eng = HFEngine(tiny_model_dir, {"max_num_seqs": 8}, device="cpu", seed=0)
    yield eng
    eng.shutdown()


def test_late_requests_join_the_running_batch(fresh_engine, hf_reference_model) -> None:
    long = GenerationRequest(
        request_id="long",
        prompt_ids=list(range(20, 45)),
        sampling=SamplingParams(max_new_tokens=300, ignore_eos=True, seed=1),
    )

    async def scenario():
        first = asyncio.create_task(fresh_engine.generate([long]))
        await asyncio.sleep(0.05)
        late = [
            GenerationRequest(
                request_id=f"late{i}",
                prompt_ids=list(range(50, 53 + 7 * i)),
                sampling=SamplingParams(max_new_tokens=6, ignore_eos=True, seed=i),
            )
            for i in range(3)
        ]
        late_results = await fresh_engine.generate(late)
        assert not first.done()  # the late ones finished while the long one was still running
        return (await first) + late_results

    results = asyncio.run(scenario())
    assert fresh_engine.stats["max_running"] >= 2
    for r in results:  # merged, differently padded KV caches still give exact log-probs
        ref = _teacher_forced(hf_reference_model, r.prompt_ids, r.output_ids)
        assert (ref - torch.tensor(r.output_log_probs)).abs().max().item() < 1e-3


def test_prefix_cache_reuses_the_previous_turn(tiny_model_dir, hf_reference_model) -> None:
    outputs = {}
    for enabled in (True, False):
        eng = HFEngine(tiny_model_dir, {"enable_prefix_caching": enabled}, device="cpu")
        try:
            greedy = SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True)
            turn1 = asyncio.run(
                eng.generate(
                    [
                        GenerationRequest(
                            request_id="t1", prompt_ids=list(range(40, 80)), sampling=greedy
                        )
                    ]
                )
            )[0]
            prompt2 = turn1.prompt_ids + turn1.output_ids + [7, 8, 9, 10]
            turn2 = asyncio.run(
                eng.generate(
                    [GenerationRequest(request_id="t2", prompt_ids=prompt2, sampling=greedy)]
                )
            )[0]
            outputs[enabled] = (
                turn2.output_ids,
                turn2.output_log_probs,
                eng.stats["prefix_hit_tokens"],
            )
        finally:
            eng.shutdown()
    ids_on, lps_on, hits_on = outputs[True]
    ids_off, lps_off, hits_off = outputs[False]
    assert hits_on == 40 + 10 - 1 and hits_off == 0
    assert ids_on == ids_off
    assert max(abs(a - b) for a, b in zip(lps_on, lps_off)) < 1e-4
    ref = _teacher_forced(hf_reference_model, prompt2, ids_on)
    assert (ref - torch.tensor(lps_on)).abs().max().item() < 1e-3


def test_update_weights_drops_prefix_cache_and_checks_names(fresh_engine) -> None:
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    asyncio.run(
        fresh_engine.generate(
            [GenerationRequest(request_id="p", prompt_ids=[5, 6, 7], sampling=greedy)]
        )
    )
    assert fresh_engine._prefixes
    state = fresh_engine.state_dict_for_check()
    fresh_engine.update_weights([("model.norm.weight", state["model.norm.weight"])], version=3)
    assert not fresh_engine._prefixes and fresh_engine.weight_version == 3
    with pytest.raises(KeyError, match="not_a_param"):
        fresh_engine.update_weights([("not_a_param", torch.zeros(1))], version=4)
    with pytest.raises(ValueError, match="shape"):
        fresh_engine.update_weights([("model.norm.weight", torch.zeros(3))], version=4)


def test_sleep_level_2_needs_new_weights(fresh_engine) -> None:
    state = fresh_engine.state_dict_for_check()
    req = GenerationRequest(
        request_id="s",
        prompt_ids=[5, 6, 7],
        sampling=SamplingParams(max_new_tokens=3, temperature=0.0),
    )
    before = asyncio.run(fresh_engine.generate([req]))[0].output_ids
    fresh_engine.sleep(2)
    fresh_engine.wake_up()
    with pytest.raises(EngineAsleepError, match="update_weights"):
        asyncio.run(fresh_engine.generate([req]))
    fresh_engine.update_weights(state.items(), version=1)
    assert asyncio.run(fresh_engine.generate([req]))[0].output_ids == before


def _plain_warp(logits, temperature, top_p, top_k):
    """Reference: sort once, keep top-k, then the smallest prefix reaching top_p mass."""
    values = [x / temperature for x in logits.tolist()]
    order = sorted(range(len(values)), key=lambda i: -values[i])
    kept = order[:top_k] if top_k > 0 else order
    z = sum(math.exp(values[i]) for i in kept)
    out, mass = set(), 0.0
    for i in kept:
        if mass >= top_p:
            break
        out.add(i)
        mass += math.exp(values[i]) / z
    return out


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"),
    [(1.0, 1.0, -1), (0.7, 0.9, -1), (1.3, 1.0, 5), (0.5, 0.6, 20)],
)
def test_warp_logits_matches_plain_reference(temperature, top_p, top_k) -> None:
    logits = torch.randn(64, generator=torch.Generator().manual_seed(4)) * 3
    warped = warp_logits(logits, temperature, top_p, top_k)
    kept = {i for i in range(64) if warped[i].item() != float("-inf")}
    assert kept == _plain_warp(logits, temperature, top_p, top_k)
    finite = torch.isfinite(warped)
    assert torch.allclose(warped[finite], logits[finite] / temperature)


def test_config_errors_and_registry(tiny_model_dir) -> None:
    with pytest.raises(ValueError, match="gpu_memory_utilisation is not an hf_infer option"):
        HFEngine(tiny_model_dir, {"gpu_memory_utilisation": 0.5}, device="cpu")
    with pytest.raises(ValueError, match="dtype"):
        HFEngine(tiny_model_dir, dtype="float8", device="cpu")
    assert {"hf_infer", "vllm"} <= set(list_engines())
    with pytest.raises(ValueError, match="already registered"):
        register_engine("hf_infer", HFEngine)
    with pytest.raises(KeyError, match="unknown engine"):
        build_engine("nope", tiny_model_dir)


@pytest.mark.parametrize("value", ["false", "False", 1, True, None])
def test_strategy_config_never_turns_remote_code_on(tiny_model_dir, value) -> None:
    """strategy_config.trust_remote_code: only a real False; 'false' was truthy (bool('false'))."""
    with pytest.raises(ValueError, match="trust_remote_code=.*never run"):
        HFEngine(tiny_model_dir, {"trust_remote_code": value}, device="cpu")


def test_loader_gets_trust_remote_code_only_from_the_argument(tiny_model_dir, monkeypatch) -> None:
    from transformers import AutoModelForCausalLM

    seen: list[object] = []
    load = AutoModelForCausalLM.from_pretrained

    def recording(*args, **kwargs):
        seen.append(kwargs["trust_remote_code"])
        return load(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", recording)
    HFEngine(tiny_model_dir, {"trust_remote_code": False}, device="cpu").shutdown()
    HFEngine(tiny_model_dir, device="cpu", trust_remote_code=True).shutdown()
    assert seen == [False, True] and all(type(v) is bool for v in seen)
    with pytest.raises(TypeError, match="must be a bool"):
        HFEngine(tiny_model_dir, device="cpu", trust_remote_code="yes")  # type: ignore[arg-type]


def test_sample_tokens_draws_from_the_warped_distribution() -> None:
    """Empirical frequencies of the Gumbel-max draw match softmax(warped logits)."""
    from rl_rollout.sampling import sample_tokens

    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    draws = 8000
    batch = logits.expand(draws, -1).clone()
    gen = torch.Generator().manual_seed(0)
    for temperature, top_p, top_k in (
        (1.0, 1.0, -1),
        (0.5, 1.0, -1),
        (1.0, 0.8, -1),
        (1.0, 1.0, 2),
    ):
        tokens = sample_tokens(
            batch, [temperature] * draws, [top_p] * draws, [top_k] * draws, [gen] * draws
        )
        freq = torch.bincount(tokens, minlength=6).float() / draws
        expected = torch.softmax(warp_logits(logits, temperature, top_p, top_k), -1)
        assert (freq - expected).abs().max().item() < 0.02, (temperature, top_p, top_k)
    greedy = sample_tokens(logits.unsqueeze(0), [0.0], [1.0], [-1], [None])
    assert greedy.tolist() == [0]


def test_repetition_penalty_changes_greedy_tokens_and_log_probs(
    fresh_engine, hf_reference_model
) -> None:
    """A huge penalty forbids repeating any token of the prompt or output (greedy); the recorded
    log-probs are those of the penalised distribution the tokens came from (vLLM's processed
    log-probs), not the raw model's."""
    from rl_rollout.sampling import apply_repetition_penalty

    prompt = list(range(20, 30))

    def run(penalty: float) -> object:
        params = SamplingParams(
            max_new_tokens=24, temperature=0.0, ignore_eos=True, repetition_penalty=penalty
        )
        req = GenerationRequest(request_id=f"r{penalty}", prompt_ids=prompt, sampling=params)
        return asyncio.run(fresh_engine.generate([req]))[0]

    plain, penalised = run(1.0), run(1e6)
    assert len(set(plain.output_ids)) < len(plain.output_ids)  # the tiny model repeats itself
    out = penalised.output_ids
    assert len(set(out)) == len(out) and not set(out) & set(prompt)
    ids = torch.tensor([prompt + out])
    with torch.no_grad():
        logits = hf_reference_model(ids).logits[0].float()
    expected = torch.stack(
        [
            torch.log_softmax(
                apply_repetition_penalty(logits[len(prompt) - 1 + i], prompt + out[:i], 1e6), -1
            )[token]
            for i, token in enumerate(out)
        ]
    )
    recorded = torch.tensor(penalised.output_log_probs)
    assert torch.allclose(recorded, expected, atol=1e-4)
    raw = _teacher_forced(hf_reference_model, prompt, out)
    assert (recorded - raw).abs().max().item() > 1e-3


def test_apply_repetition_penalty_is_ctrl_rule() -> None:
    from rl_rollout.sampling import apply_repetition_penalty

    logits = torch.tensor([2.0, -2.0, 1.0])
    out = apply_repetition_penalty(logits, [0, 1, 1], 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0]
    assert apply_repetition_penalty(logits, [0], 1.0) is logits


def test_kv_cache_layers_grow_in_place_and_equal_concatenation() -> None:
    """The engine's cache layers append into spare capacity (no copy of the whole cache per
    decode step) and always hold exactly what concatenation would; a layer whose tensors were
    replaced from outside (retired rows, merged batches) is re-buffered from the new tensors."""
    from transformers import Qwen2Config

    from rl_rollout.hf_engine import _new_cache

    config = Qwen2Config(
        vocab_size=32,
        hidden_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
    )
    layer = _new_cache(config).layers[0]
    gen = torch.Generator().manual_seed(0)

    def kv(batch: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.randn(batch, 1, n, 64, generator=gen),
            torch.randn(batch, 1, n, 64, generator=gen),
        )

    ref_k, ref_v = kv(3, 5)  # prefill of 5 columns
    layer.update(ref_k, ref_v)
    storages = set()
    for _ in range(40):  # decode steps, one column each
        k, v = kv(3, 1)
        keys, values = layer.update(k, v)
        ref_k, ref_v = torch.cat([ref_k, k], dim=2), torch.cat([ref_v, v], dim=2)
        assert torch.equal(keys, ref_k) and torch.equal(values, ref_v)
        storages.add(keys.data_ptr())
    assert len(storages) == 1  # 45 columns fit the first buffer: no reallocation, no copy
    keep = torch.tensor([0, 2])  # the engine retires row 1 and drops 3 padding columns
    layer.keys = layer.keys.index_select(0, keep)[:, :, 3:]
    layer.values = layer.values.index_select(0, keep)[:, :, 3:]
    ref_k, ref_v = ref_k[keep][:, :, 3:], ref_v[keep][:, :, 3:]
    for _ in range(100):  # past the new buffer's capacity too
        k, v = kv(2, 1)
        keys, values = layer.update(k, v)
        ref_k, ref_v = torch.cat([ref_k, k], dim=2), torch.cat([ref_v, v], dim=2)
    assert torch.equal(keys, ref_k) and torch.equal(values, ref_v)
    assert layer.get_seq_length() == 42 + 100


def test_padded_batch_with_early_finishers_keeps_exact_log_probs(
    fresh_engine, hf_reference_model
) -> None:
    """Rows of different prompt lengths (left padding in the decode mask) and lengths (rows
    retire mid-batch while the others go on past the cache's first capacity)."""
    requests = [
        GenerationRequest(
            request_id=f"r{i}",
            prompt_ids=list(range(30, 33 + 9 * i)),
            sampling=SamplingParams(max_new_tokens=(12, 90, 30, 75)[i], ignore_eos=True, seed=i),
        )
        for i in range(4)
    ]
    results = asyncio.run(fresh_engine.generate(requests))
    assert [len(r.output_ids) for r in results] == [12, 90, 30, 75]
    for r in results:
        ref = _teacher_forced(hf_reference_model, r.prompt_ids, r.output_ids)
        assert (ref - torch.tensor(r.output_log_probs)).abs().max().item() < 1e-3


def test_gqa_sdpa_equals_transformers_sdpa_without_copying_the_cache(
    tiny_model_dir, monkeypatch
) -> None:
    """The engine's attention (rl_gqa_sdpa) gives transformers' sdpa outputs on a left-padded
    prefill and a masked decode step of a grouped-query model, without repeat_kv's cache copy."""
    import transformers.integrations.sdpa_attention as hf_sdpa
    from transformers import AutoModelForCausalLM, DynamicCache

    from rl_rollout.gqa_attention import RL_GQA_SDPA, register_gqa_sdpa

    def run(attn: str) -> list[torch.Tensor]:
        model = AutoModelForCausalLM.from_pretrained(
            tiny_model_dir, dtype=torch.float32, attn_implementation=attn
        ).eval()
        assert model.config.num_attention_heads > model.config.num_key_value_heads  # GQA
        ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
        mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            pre = model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                past_key_values=cache,
            ).logits
            step_mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
            dec = model(
                input_ids=torch.tensor([[13], [14]]),
                attention_mask=step_mask.bool()[:, None, None, :],
                position_ids=torch.tensor([[3], [5]]),
                past_key_values=cache,
            ).logits
        return [pre[0, 2:], pre[1], dec]

    copies: list[tuple[int, ...]] = []
    repeat_kv = hf_sdpa.repeat_kv
    monkeypatch.setattr(
        hf_sdpa, "repeat_kv", lambda t, n: copies.append(tuple(t.shape)) or repeat_kv(t, n)
    )
    expected = run("sdpa")
    assert copies  # transformers' sdpa copies the KV under a mask (what this avoids)
    copies.clear()
    got = run(register_gqa_sdpa())
    assert not copies
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    engine = HFEngine(tiny_model_dir, device="cpu")
    try:
        assert engine.model.config._attn_implementation == RL_GQA_SDPA
    finally:
        engine.shutdown()
