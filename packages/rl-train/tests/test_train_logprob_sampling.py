"""The trainer's log-probs are those of the distribution the rollout sampled from: temperature,
then top-k, then top-p, renormalised (``TrainingArgs.logprob_sampling``). Every actor/reference
path (padded, packed, shared-prompt, fused head; forward, train_step and the old log-probs of PPO
epochs) equals a teacher-forced reference built from rl-rollout's own sampling functions, and the
HF engine's recorded log-probs equal the trainer's for the same tokens."""

from __future__ import annotations

import asyncio

import pytest
import torch

import rl_train
from rl_algos.logprobs import truncation_keep_mask
from rl_rollout.sampling import draw_tokens, log_probs_of, sampling_scores, warp_logits
from rl_train.args import LogprobSampling
from rl_train.testing import make_batch, nll_loss

SAMPLING = LogprobSampling(temperature=0.8, top_k=5, top_p=0.9)


def _scores(logits: torch.Tensor, s: LogprobSampling) -> torch.Tensor:
    """rl-rollout's sampling scores of ``logits [N, V]`` under ``s``."""
    n = logits.shape[0]
    return sampling_scores(logits, [s.temperature] * n, [s.top_p or 1.0] * n, [s.top_k or -1] * n)


def _hf_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _sampled_batch(path: str, s: LogprobSampling, rows: int = 6, seed: int = 0) -> dict:
    """Right-padded rows whose responses were drawn token by token from ``s`` with rl-rollout's
    sampler (as a rollout does); consecutive pairs share a prompt (the shared-prompt path)."""
    model = _hf_model(path)
    prompts = make_batch(rows, 8, prompt_len=4, seed=seed, group_size=2)["input_ids"][:, :4]
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(10, 17, (rows,), generator=gen)
    width = int(lengths.max())
    ids = torch.zeros(rows, width, dtype=torch.long)
    with torch.no_grad():
        for b in range(rows):
            seq = prompts[b].tolist()
            while len(seq) < int(lengths[b]):
                logits = model(input_ids=torch.tensor([seq])).logits[0, -1:]
                seq.append(int(draw_tokens(_scores(logits, s), [s.temperature], [gen])[0]))
            ids[b, : len(seq)] = torch.tensor(seq)
    cols = torch.arange(width)[None, :]
    attention = (cols < lengths[:, None]).long()
    response = attention.bool() & (cols >= 4)
    return {"input_ids": ids, "attention_mask": attention, "response_mask": response}


def _teacher_forced(path: str, batch: dict, s: LogprobSampling) -> torch.Tensor:
    """``[B, T]``: per row one plain forward on its real tokens, then rl-rollout's
    ``log_probs_of(sampling_scores(...))`` of each next token (prompt tokens may be -inf: they were
    not sampled)."""
    model = _hf_model(path)
    out = torch.zeros(batch["input_ids"].shape)
    with torch.no_grad():
        for b in range(out.shape[0]):
            n = int(batch["attention_mask"][b].sum())
            ids = batch["input_ids"][b, :n]
            logits = model(input_ids=ids[None]).logits[0, :-1]
            out[b, 1:n] = log_probs_of(_scores(logits, s), ids[1:])
    return out


def _backend(path: str, role: str, path_kind: str, **targs):
    training_args = dict(
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        learning_rate=0.0,
        infer_batch_size=4,
        logprob_sampling=SAMPLING,
        use_sequence_packing=path_kind == "packed",
        share_prompt_forward=path_kind == "shared_prompt",
    )
    training_args.update(targs)
    strategy = {"fused_lm_head": True} if path_kind == "fused_head" else {}
    return rl_train.build_backend(
        "hf_infer", role=role, model_path=path, training_args=training_args,
        strategy_config=strategy,
    )  # fmt: skip


@pytest.fixture(scope="module")
def sampled(tiny_model_path):
    batch = _sampled_batch(tiny_model_path, SAMPLING)
    return batch, _teacher_forced(tiny_model_path, batch, SAMPLING)


def test_the_keep_mask_is_the_rollout_samplers_set():
    """``truncation_keep_mask`` keeps exactly the tokens rl-rollout's ``warp_logits`` leaves
    finite, ties included (logits drawn from a few values, so ties at the k-th value and at the
    top-p boundary happen)."""
    g = torch.Generator().manual_seed(0)
    ties = 0
    for _ in range(200):
        logits = torch.randint(0, 4, (12,), generator=g).float() * 0.5
        temperature = float(torch.empty(1).uniform_(0.5, 1.5, generator=g))
        top_k = int(torch.randint(1, 14, (1,), generator=g))
        top_p = float(torch.empty(1).uniform_(0.2, 1.0, generator=g))
        engine = torch.isfinite(warp_logits(logits, temperature, top_p, top_k))
        mask = truncation_keep_mask((logits / temperature)[None], top_k, top_p)[0]
        assert torch.equal(mask, engine), (logits, temperature, top_k, top_p)
        ties += int(engine.sum() > min(top_k, 12))
    assert ties > 10  # top-k ties were exercised


@pytest.mark.parametrize("path_kind", ["padded", "packed", "shared_prompt", "fused_head"])
@pytest.mark.parametrize("role", ["reference", "actor"])
def test_forward_equals_the_rollout_samplers_log_probs(tiny_model_path, sampled, role, path_kind):
    batch, expected = sampled
    response = batch["response_mask"]
    out = _backend(tiny_model_path, role, path_kind).forward(batch)
    assert out.log_probs is not None
    torch.testing.assert_close(out.log_probs[response], expected[response], atol=1e-5, rtol=0)
    # prompt tokens (not sampled, often outside the set) join the set: finite
    assert torch.isfinite(out.log_probs).all()
    # the truncation matters: the untruncated temperature's log-probs are visibly lower
    full = _teacher_forced(tiny_model_path, batch, LogprobSampling(SAMPLING.temperature))
    assert (expected[response] - full[response]).max() > 1e-2


@pytest.mark.parametrize("path_kind", ["padded", "packed", "fused_head"])
def test_train_step_and_old_log_probs_equal_the_rollout_samplers(
    tiny_model_path, sampled, path_kind
):
    """The log-probs the loss trains through (with grad) and the old log-probs of PPO epochs
    (a no-grad forward) are the truncated distribution's; a loss declaring its own sampling (the
    supervised warm-up: the raw model) reads the full distribution at temperature 1."""
    batch, expected = sampled
    response = batch["response_mask"]
    seen: list[torch.Tensor] = []
    old: list[torch.Tensor] = []

    def loss_fn(mb, fwd, ctx):
        seen.append(fwd.log_probs.detach().cpu())
        old.append(mb["old_log_probs"].cpu())
        return nll_loss(mb, fwd, ctx)

    loss_fn.reads_old_log_probs = True  # type: ignore[attr-defined]
    backend = _backend(tiny_model_path, "actor", path_kind, ppo_epochs=2)
    backend.train_step(dict(batch), loss_fn)
    rows = batch["input_ids"].shape[0]
    for got in (torch.cat(seen[:3]), torch.cat(old[:3])):  # epoch 1: 3 micro-batches in order
        assert got.shape[0] == rows
        torch.testing.assert_close(got[response], expected[response], atol=1e-5, rtol=0)

    seen.clear()
    sft = lambda mb, fwd, ctx: (seen.append(fwd.log_probs.detach().cpu()), nll_loss(mb, fwd, ctx))[1]  # noqa: E731  # fmt: skip
    sft.logprob_sampling = LogprobSampling()  # type: ignore[attr-defined]
    backend.train_step(dict(batch), sft, epochs=1)
    raw = _teacher_forced(tiny_model_path, batch, LogprobSampling())
    torch.testing.assert_close(torch.cat(seen)[response], raw[response], atol=1e-5, rtol=0)


@pytest.mark.parametrize("path_kind", ["padded", "packed", "fused_head"])
def test_gradient_is_finite_for_tokens_outside_the_set(tiny_model_path, path_kind):
    """Random tokens (as a stale policy's samples can be) lie mostly outside a top-2 / top-p 0.5
    set of the current policy: their log-probs are finite (renormalised over the set plus the
    token), so is the gradient, and the step is applied."""
    batch = make_batch(4, 14, vocab=1000, seed=4)
    sampling = LogprobSampling(temperature=1.0, top_k=2, top_p=0.5)
    backend = _backend(tiny_model_path, "actor", path_kind, logprob_sampling=sampling,
                       learning_rate=1e-3)  # fmt: skip
    out = backend.forward(batch)
    assert out.log_probs is not None and out.entropy is not None
    assert torch.isfinite(out.log_probs).all() and torch.isfinite(out.entropy).all()
    assert (out.log_probs[batch["response_mask"]] < 0).all()
    metrics = backend.train_step(dict(batch), nll_loss, epochs=1)
    assert metrics["actor/skipped_steps"] == 0.0
    assert torch.isfinite(torch.tensor(metrics["actor/grad_norm"]))
    assert metrics["actor/grad_norm"] > 0


def test_hf_engine_truncated_log_probs_match_trainer(tiny_model_path):
    """The HF engine samples at T=0.8, top_k=5, top_p=0.9 and records each token's log-prob; the
    trainer's forward of the same tokens under the same ``logprob_sampling`` gives the same
    numbers (1e-4), and visibly not those of the untruncated temperature."""
    from rl_config.records import GenerationRequest, SamplingParams
    from rl_rollout import build_engine

    params = SamplingParams(max_new_tokens=20, temperature=0.8, top_k=5, top_p=0.9, seed=7,
                            ignore_eos=True)  # fmt: skip
    prompts = [[5, 17, 42], list(range(30, 45)), [7] * 6, list(range(100, 109))]
    engine = build_engine("hf_infer", tiny_model_path, {"max_num_seqs": 4}, dtype="float32",
                          device="cpu", seed=0)  # fmt: skip
    try:
        requests = [
            GenerationRequest(request_id=f"r{i}", prompt_ids=p, sampling=params)
            for i, p in enumerate(prompts)
        ]
        results = asyncio.run(engine.generate(requests))
    finally:
        engine.shutdown()
    width = max(len(r.prompt_ids) + len(r.output_ids) for r in results)
    ids = torch.zeros(len(results), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    response = torch.zeros_like(ids, dtype=torch.bool)
    recorded = torch.zeros(ids.shape)
    for b, r in enumerate(results):
        seq, start = r.prompt_ids + r.output_ids, len(r.prompt_ids)
        ids[b, : len(seq)] = torch.tensor(seq)
        attention[b, : len(seq)] = 1
        response[b, start : len(seq)] = True
        recorded[b, start : len(seq)] = torch.tensor(r.output_log_probs)
    batch = {"input_ids": ids, "attention_mask": attention, "response_mask": response}
    trainer = _backend(tiny_model_path, "reference", "padded").forward(batch).log_probs
    assert trainer is not None
    worst = (trainer[response] - recorded[response]).abs().max().item()
    print(f"max |engine - trainer| truncated log-prob diff: {worst:.2e}")
    assert worst < 1e-4
    untruncated = (
        _backend(tiny_model_path, "reference", "padded", logprob_sampling=LogprobSampling(0.8))
        .forward(batch)
        .log_probs
    )
    assert untruncated is not None
    assert (recorded[response] - untruncated[response]).max() > 1e-2


def test_logprob_sampling_fields_are_checked_by_name():
    with pytest.raises(ValueError, match="logprob_sampling.temperature"):
        LogprobSampling(temperature=0.0)
    with pytest.raises(ValueError, match="logprob_sampling.top_k"):
        LogprobSampling(top_k=0)
    with pytest.raises(ValueError, match="logprob_sampling.top_p"):
        LogprobSampling(top_p=1.5)
    with pytest.raises(ValueError, match="logprob_sampling: unknown keys \\['top_n'\\]"):
        rl_train.parse_training_args({"logprob_sampling": {"top_n": 3}})
    with pytest.raises(ValueError, match="logprob_temperature is now"):
        rl_train.parse_training_args({"logprob_temperature": 0.7})
    args = rl_train.parse_training_args({"logprob_sampling": {"temperature": 0.7, "top_p": 0.9}})
    assert args.logprob_sampling == LogprobSampling(0.7, None, 0.9)
