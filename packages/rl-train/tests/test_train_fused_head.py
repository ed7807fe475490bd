"""LogProbHead: log-probs from hidden states equal the logits path (values and gradients), the model
stays an ordinary model outside a request, and the strategy option resolves per device."""

import pytest
import torch

from rl_train.args import LogprobSampling, ModelArgs
from rl_train.fused_head import LogProbHead, install_log_prob_head, log_prob_request
from rl_train.modeling import load_model, resolve_fused_lm_head, token_outputs
from rl_train.testing import make_batch


def _pair(path: str):
    args = ModelArgs(attn_implementation="sdpa")
    plain = load_model(path, "actor", args)
    fused = load_model(path, "actor", args, fused_lm_head=True)
    return plain, fused


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize(
    "sampling",
    [LogprobSampling(), LogprobSampling(0.7), LogprobSampling(0.8, top_k=5, top_p=0.9)],
    ids=["raw", "T0.7", "T0.8-k5-p0.9"],
)
def test_fused_head_matches_logits_path_values_and_gradients(tiny_model_path, packed, sampling):
    """Also under top-k / top-p truncation: the chunked hidden-state path keeps the same set,
    renormalises alike and back-propagates through the kept logits only (random labels: most
    are outside the set and join it)."""
    plain, fused = _pair(tiny_model_path)
    assert isinstance(fused.lm_head, LogProbHead)
    assert fused.lm_head.weight is fused.model.embed_tokens.weight  # still tied
    batch = make_batch(6, 24, seed=3)
    outs = []
    for model in (plain, fused):
        out = token_outputs(
            model, batch, role="actor", packed=packed, need_entropy=True, sampling=sampling
        )
        assert out.log_probs is not None and out.entropy is not None
        mask = batch["response_mask"].float()
        # a loss touching both outputs, so both backward paths are exercised
        ((out.log_probs * batch["advantages"] + 0.1 * out.entropy) * mask).sum().backward()
        outs.append(out)
    torch.testing.assert_close(outs[1].log_probs, outs[0].log_probs, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(outs[1].entropy, outs[0].entropy, atol=2e-5, rtol=1e-5)
    assert outs[0].log_probs.abs().sum() > 0
    grads = {n: p.grad for n, p in plain.named_parameters()}
    for name, p in fused.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, grads[name], atol=2e-5, rtol=1e-4, msg=name)


def test_fused_head_is_an_ordinary_lm_head_outside_a_request(tiny_model_path):
    plain, fused = _pair(tiny_model_path)
    ids = torch.tensor([[5, 9, 17, 4]])
    with torch.no_grad():
        torch.testing.assert_close(fused(input_ids=ids).logits, plain(input_ids=ids).logits)
    assert fused.state_dict().keys() == plain.state_dict().keys()
    with (
        pytest.raises(ValueError, match="do not match the hidden states"),
        log_prob_request(
            fused.lm_head,
            torch.zeros(1, 3, dtype=torch.long),
            sampling=LogprobSampling(),
            with_entropy=False,
        ),
    ):
        fused(input_ids=ids)
    assert fused.lm_head._request is None  # the request closes even when the forward raises


def test_critic_keeps_its_value_head(tiny_model_path):
    critic = load_model(tiny_model_path, "critic", ModelArgs(), fused_lm_head=True)
    assert not any(isinstance(m, LogProbHead) for m in critic.modules())
    assert install_log_prob_head(critic) is False


def test_fused_lm_head_option():
    assert resolve_fused_lm_head(None, "cuda") is True
    assert resolve_fused_lm_head(None, "npu") is True
    assert resolve_fused_lm_head(None, "cpu") is False
    assert resolve_fused_lm_head(True, "cpu") is True
    assert resolve_fused_lm_head(False, "cuda") is False
    with pytest.raises(ValueError, match="fused_lm_head"):
        resolve_fused_lm_head("yes", "cuda")
