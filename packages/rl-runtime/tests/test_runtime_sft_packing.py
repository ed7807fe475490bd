"""Packing equals padding: the same supervised examples give the same per-token log-probs, the
same loss and the same gradients packed into one stream (position ids restarting per example)
as right-padded rows, on a real (tiny, random) Qwen2 model; and the packs respect capacity."""

import pytest
import torch

from rl_algos.losses import sft_loss
from rl_runtime.step.sft_data import SFTExample, collate
from rl_runtime.step.sft_packing import pack_examples, packed_batch, unpack

EXAMPLES = [
    SFTExample((3, 17, 5, 9, 11), (False, False, True, True, True)),
    SFTExample((4, 8), (False, True)),
    SFTExample((21, 22, 23, 24, 25, 26, 27), (False, False, False, True, False, True, True)),
]


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        initializer_range=0.2, attn_implementation="sdpa",
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg).to(torch.float64).eval()


def _token_log_probs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """`[B, T]` log p(ids[t] | ids[<t]) (0 at t = 0)."""
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    return torch.cat([lp.new_zeros(lp.shape[0], 1), lp], dim=1)


def _loss_and_grads(model, loss):
    model.zero_grad()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_packed_stream_equals_padded_rows(model):
    padded = collate(EXAMPLES, pad_token_id=0)
    out = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"])
    lp_pad = _token_log_probs(out.logits, padded["input_ids"])
    loss_pad, g_pad = _loss_and_grads(
        model, sft_loss(lp_pad, padded["response_mask"]).loss("token-mean")
    )

    packed = packed_batch(EXAMPLES)
    assert packed["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 0, 1, 2, 3, 4, 5, 6]]
    assert packed["cu_seqlens"].tolist() == [0, 5, 7, 14]
    out = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"], use_cache=False)
    lp = _token_log_probs(out.logits, packed["input_ids"])
    loss_pack, g_pack = _loss_and_grads(
        model, sft_loss(lp, packed["response_mask"]).loss("token-mean")
    )

    # per example: the packed log-probs on trained tokens are the padded ones
    mask = padded["response_mask"]
    rows = unpack(lp, packed["lengths"])
    for i, (row, flags) in enumerate(zip(rows, unpack(packed["response_mask"], packed["lengths"]))):
        n = len(EXAMPLES[i].token_ids)
        assert flags.tolist() == mask[i, :n].tolist()
        torch.testing.assert_close(row[flags], lp_pad[i, :n][flags], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(loss_pack, loss_pad, rtol=1e-10, atol=1e-10)
    for name in g_pad:
        torch.testing.assert_close(g_pack[name], g_pad[name], rtol=1e-8, atol=1e-10)


def test_without_restarting_positions_examples_would_see_each_other(model):
    """The check above discriminates: one stream with positions 0..N-1 (no separation) gives
    other log-probs for the second and third examples."""
    packed = packed_batch(EXAMPLES)
    with torch.no_grad():
        sep = model(
            input_ids=packed["input_ids"], position_ids=packed["position_ids"], use_cache=False
        ).logits
        joined = model(input_ids=packed["input_ids"], use_cache=False).logits
    assert torch.allclose(sep[0, :5], joined[0, :5])
    assert not torch.allclose(sep[0, 5:], joined[0, 5:], atol=1e-4)


def test_rl_train_packed_forward_equals_padded_for_the_sft_loss(model):
    """The trainer's own packing (rl_train.modeling.token_outputs, `use_sequence_packing`) with
    the runtime's SFT loss: the same loss and gradients as its padded forward."""
    from rl_train.modeling import token_outputs

    batch = collate(EXAMPLES, pad_token_id=0)
    results = []
    for packed in (False, True):
        out = token_outputs(model, dict(batch), role="actor", packed=packed)
        loss = sft_loss(out.log_probs, batch["response_mask"]).loss("token-mean")
        results.append(_loss_and_grads(model, loss))
    (l0, g0), (l1, g1) = results
    torch.testing.assert_close(l1, l0, rtol=1e-10, atol=1e-10)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-8, atol=1e-10)


def test_pack_examples_fills_packs_under_capacity():
    examples = [SFTExample((1,) * n, (False,) * n) for n in (5, 2, 7, 3, 9)]
    packs = pack_examples(examples, capacity=10)
    assert sorted(i for p in packs for i in p) == [0, 1, 2, 3, 4]
    assert all(sum(len(examples[i].token_ids) for i in p) <= 10 for p in packs)
    assert packs == [[4], [2, 3], [0, 1]]
    assert pack_examples([SFTExample((1,) * 12, (False,) * 12)], capacity=10) == [[0]]
