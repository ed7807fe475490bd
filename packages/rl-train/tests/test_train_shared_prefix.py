"""Shared-prompt forward (rl_train.shared_prefix) against the plain forward on a tiny Qwen2, fp32:
equal response log-probs/entropy and parameter gradients; each distinct prompt runs once."""

from __future__ import annotations

import pytest
import torch
from transformers.modeling_layers import GradientCheckpointingLayer

from rl_train.args import ModelArgs
from rl_train.fused_head import install_log_prob_head
from rl_train.modeling import enable_gradient_checkpointing, load_model, token_outputs
from rl_train.shared_prefix import check_shared_prompt, plan_prefixes
from rl_train.testing import rows_batch
from rl_train.types import Batch


def _tokens(g: torch.Generator, n: int) -> list[int]:
    return torch.randint(5, 1000, (n,), generator=g).tolist()


def grouped(prompt_lens: list[int], group: int, resp_lens: tuple[int, int], seed: int = 0):
    """``len(prompt_lens)`` groups of ``group`` rows sharing a prompt; responses of random length
    in ``resp_lens`` (inclusive)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in prompt_lens:
        prompt = _tokens(g, n)
        for _ in range(group):
            k = int(torch.randint(resp_lens[0], resp_lens[1] + 1, (1,), generator=g))
            rows.append((prompt, _tokens(g, k)))
    return rows_batch(rows)


CASES = {
    "groups_of_different_prompt_lengths": lambda: grouped([7, 3, 11], 4, (2, 6)),
    "ragged_responses_one_group": lambda: grouped([9], 6, (1, 9), seed=1),
    "no_shared_prompts": lambda: grouped([5, 6, 7, 8], 1, (2, 5), seed=2),
    "single_row": lambda: grouped([6], 1, (4, 4), seed=3),
    "same_length_different_prompts": lambda: grouped([6, 6], 3, (2, 4), seed=4),
}


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request, tiny_model_path):
    m = load_model(tiny_model_path, "actor", ModelArgs(attn_implementation=request.param))
    m.train()
    return m


def _response_cols(batch: Batch) -> torch.Tensor:
    """Columns the shared path must match: from the first response token on, real tokens."""
    resp = batch["response_mask"]
    first = torch.where(resp.any(1), resp.int().argmax(1), batch["attention_mask"].sum(1))
    cols = torch.arange(resp.shape[1])[None, :]
    return (cols >= first[:, None]) & batch["attention_mask"].bool()


def _log_probs(model, batch: Batch, **kwargs) -> torch.Tensor:
    lp = token_outputs(model, batch, **kwargs).log_probs
    assert lp is not None
    return lp


def _run(model, batch: Batch, share: bool, entropy: bool):
    """``(log_probs, entropy or None, parameter grads)`` of a weighted loss on the response."""
    model.zero_grad(set_to_none=True)
    out = token_outputs(model, batch, role="actor", need_entropy=entropy, share_prompt=share)
    lp, ent = out.log_probs, out.entropy
    assert lp is not None and (ent is not None) == entropy
    weights = torch.linspace(0.5, 1.5, lp.numel()).reshape(lp.shape)
    loss = (lp * weights * batch["response_mask"]).sum()
    if ent is not None:
        loss = loss + 0.3 * (ent * batch["response_mask"]).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp, ent, grads


def _assert_equivalent(model, batch: Batch, entropy: bool = False) -> None:
    plain, plain_ent, g_plain = _run(model, batch, False, entropy)
    shared, shared_ent, g_shared = _run(model, batch, True, entropy)
    keep = _response_cols(batch)
    assert shared.shape == plain.shape
    torch.testing.assert_close(shared[keep], plain[keep], atol=1e-5, rtol=1e-5)
    assert torch.all(shared[~keep] == 0)  # col 0, prompt columns, padding
    assert torch.all(shared[keep] != 0)
    if shared_ent is not None and plain_ent is not None:
        torch.testing.assert_close(shared_ent[keep], plain_ent[keep], atol=1e-5, rtol=1e-5)
        assert torch.all(shared_ent[~keep] == 0)
    assert g_shared.keys() == g_plain.keys() and g_plain
    for name in g_plain:
        # fp32 sums in another order: a prompt token's embedding gradient adds up every row's
        # share at once instead of row by row, so its error grows with the gradient's size
        # (12.6 here: 1.2e-5 apart on an AVX-512 CPU)
        atol = max(1e-5, 2e-6 * float(g_plain[name].abs().max()))
        torch.testing.assert_close(g_shared[name], g_plain[name], atol=atol, rtol=1e-4, msg=name)


@pytest.mark.parametrize("case", sorted(CASES))
def test_shared_prompt_matches_plain_forward(model, case):
    _assert_equivalent(model, CASES[case]())


def test_entropy_matches(model):
    _assert_equivalent(model, CASES["groups_of_different_prompt_lengths"](), entropy=True)


CACHE_THROUGH_CHECKPOINTING = hasattr(GradientCheckpointingLayer, "_can_checkpoint_with_cache")


@pytest.mark.skipif(
    not CACHE_THROUGH_CHECKPOINTING,
    reason="transformers < 5 drops a checkpointed layer's cache: share_prompt_forward with "
    "gradient checkpointing is refused there (test_checkpointed_shared_prompt_is_refused_...)",
)
def test_fused_head_and_gradient_checkpointing(tiny_model_path):
    """LogProbHead (labels per row, no [N, V] logits) and a checkpointed replay of every layer:
    the prefix cache must survive the backward recompute unchanged."""
    m = load_model(tiny_model_path, "actor", ModelArgs(attn_implementation="sdpa"))
    assert install_log_prob_head(m)
    enable_gradient_checkpointing(m)
    m.train()
    _assert_equivalent(m, CASES["groups_of_different_prompt_lengths"](), entropy=True)


def test_checkpointed_shared_prompt_is_refused_before_transformers_5(tiny_model_path, monkeypatch):
    """transformers 4.57 (vllm-ascend 0.11's) has no ``_can_checkpoint_with_cache`` and silently
    drops the prefix cache of a checkpointed layer in training (every shared-prompt log-prob was
    wrong): refused by name. Simulated on transformers 5 by removing the switch."""
    monkeypatch.delattr(GradientCheckpointingLayer, "_can_checkpoint_with_cache", raising=False)
    m = load_model(tiny_model_path, "actor", ModelArgs(attn_implementation="sdpa"))
    enable_gradient_checkpointing(m)
    m.train()
    batch = CASES["groups_of_different_prompt_lengths"]()
    with pytest.raises(RuntimeError, match=r"share_prompt_forward with checkpointed .* >= 5"):
        token_outputs(m, batch, role="actor", share_prompt=True)
    with torch.no_grad():  # no backward replay: nothing to refuse
        token_outputs(m, batch, role="actor", share_prompt=True)


def test_multi_turn_rows_share_only_the_first_segment(model):
    """Rows ``[prompt | response | env tokens | response]``: later segments are the row's own."""
    g = torch.Generator().manual_seed(5)
    prompt = _tokens(g, 6)
    rows = []
    for k in (2, 3, 4):
        resp, env, resp2 = _tokens(g, k), _tokens(g, 3), _tokens(g, 2)
        rows.append((prompt, resp + env + resp2, len(resp)))
    batch = rows_batch([(p, r) for p, r, _ in rows])
    for i, (p, _, k) in enumerate(rows):  # the env tokens are not response
        batch["response_mask"][i, len(p) + k : len(p) + k + 3] = False
    _assert_equivalent(model, batch)


def test_no_grad_forward_matches(model):
    batch = CASES["groups_of_different_prompt_lengths"]()
    with torch.no_grad():
        plain = _log_probs(model, batch, role="reference")
        shared = _log_probs(model, batch, role="reference", share_prompt=True)
    keep = _response_cols(batch)
    torch.testing.assert_close(shared[keep], plain[keep], atol=1e-5, rtol=1e-5)


def test_each_distinct_prompt_runs_once(model):
    """Tokens fed to the embedding: one padded pass of the 3 distinct prefixes, then each row's own
    tokens; far fewer than the plain forward. Fails if the shared path falls back to the plain one."""
    batch = CASES["groups_of_different_prompt_lengths"]()  # prompts 7, 3, 11; 4 rows each
    shapes: list[tuple[int, ...]] = []
    hook = model.get_input_embeddings().register_forward_pre_hook(
        lambda _m, args: shapes.append(tuple(args[0].shape))
    )
    try:
        with torch.no_grad():
            token_outputs(model, batch, role="actor", share_prompt=True)
    finally:
        hook.remove()
    lengths = batch["attention_mask"].sum(1)
    own = int((lengths - torch.tensor([6] * 4 + [2] * 4 + [10] * 4)).max())
    assert shapes == [(3, 10), (12, own)]
    plain_tokens = 12 * int(lengths.max())
    assert 3 * 10 + 12 * own < 0.7 * plain_tokens


def test_plan_groups_equal_prefixes_only():
    batch = rows_batch(
        [([1, 2, 3], [9]), ([1, 2, 3], [8, 7]), ([1, 2, 4], [9]), ([1, 2], [5, 6]), ([7], [1])]
    )
    plan = plan_prefixes(batch["input_ids"], batch["attention_mask"], batch["response_mask"])
    assert plan.prefix_lens.tolist() == [2, 2, 2, 1, 0]
    # [1, 2] is the prefix of the first three rows (the last prompt token runs with its row)
    assert plan.first_rows.tolist() == [0, 3, 4]
    assert plan.row_prefix.tolist() == [0, 0, 0, 1, 2]


def test_row_without_response_tokens(model):
    batch = CASES["ragged_responses_one_group"]()
    batch["response_mask"][2] = False  # e.g. an empty response: nothing to predict but padding
    plain = _log_probs(model, batch, role="actor")
    shared = _log_probs(model, batch, role="actor", share_prompt=True)
    keep = _response_cols(batch)
    torch.testing.assert_close(shared[keep], plain[keep], atol=1e-5, rtol=1e-5)


def test_refused_where_it_cannot_apply(tiny_model_path):
    sdpa = load_model(tiny_model_path, "actor", ModelArgs(attn_implementation="sdpa"))
    check_shared_prompt("actor", packed=False, model=sdpa)
    with pytest.raises(ValueError, match="share_prompt_forward.*critic"):
        check_shared_prompt("critic", packed=False, model=sdpa)
    with pytest.raises(ValueError, match="share_prompt_forward.*packing"):
        check_shared_prompt("actor", packed=True, model=sdpa)
    sdpa.config._attn_implementation = "flash_attention_2"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="share_prompt_forward needs attn_implementation"):
        check_shared_prompt("reference", packed=False, model=sdpa)
    batch = CASES["single_row"]()
    with pytest.raises(ValueError, match="share_prompt_forward.*packing"):
        token_outputs(sdpa, batch, role="actor", packed=True, share_prompt=True)
    del batch["response_mask"]
    with pytest.raises(ValueError, match="response_mask"):
        token_outputs(sdpa, batch, role="actor", share_prompt=True)


def test_backend_reads_the_key_and_refuses_the_critic(tiny_model_path):
    """training_args.share_prompt_forward reaches the backend's forward (each distinct prompt runs
    once); a critic with it fails when the backend is built."""
    from rl_train.registry import build_backend

    args = dict(share_prompt_forward=True, infer_batch_size=12)
    backend = build_backend(
        "hf_infer", role="reference", model_path=tiny_model_path, training_args=args
    )
    batch = CASES["groups_of_different_prompt_lengths"]()
    rows: list[int] = []
    embed = backend.model.get_input_embeddings()  # type: ignore[attr-defined]
    hook = embed.register_forward_pre_hook(lambda _m, a: rows.append(int(a[0].shape[0])))
    try:
        lp = backend.forward(batch).log_probs
    finally:
        hook.remove()
    assert rows == [3, 12]  # 3 distinct prompts, then the 12 rows
    assert lp is not None
    keep = _response_cols(batch)
    assert torch.all(lp[keep] != 0) and torch.all(lp[~keep] == 0)
    with pytest.raises(ValueError, match="share_prompt_forward.*critic"):
        build_backend("hf_infer", role="critic", model_path=tiny_model_path, training_args=args)
