"""compile_layers: compiled decoder layers give the eager model's log-probs and gradients, keep
parameter names, and leave module hooks outside the compiled code."""

import pytest
import torch

from rl_train.args import ModelArgs
from rl_train.modeling import (
    compile_decoder_layers,
    load_model,
    resolve_compile_layers,
    token_outputs,
)
from rl_train.testing import make_batch


@pytest.mark.slow  # inductor compiles C++ kernels on the CPU: ~1 min
def test_compiled_layers_match_eager(tiny_model_path):
    batch = make_batch(4, 20, seed=1)
    results = []
    for compiled in (False, True):
        model = load_model(tiny_model_path, "actor", ModelArgs(attn_implementation="sdpa"))
        names = list(model.state_dict())
        if compiled:
            assert compile_decoder_layers(model) == 2
            assert list(model.state_dict()) == names
        calls = []
        model.model.layers[0].register_forward_pre_hook(lambda *_, c=calls: c.append(1))
        for packed in (False, True):
            out = token_outputs(model, batch, role="actor", packed=packed, need_entropy=True)
            assert out.log_probs is not None and out.entropy is not None
            (out.log_probs.sum() + out.entropy.sum()).backward()
        assert len(calls) == 2  # the hook still runs once per forward
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results.append((out.log_probs.detach(), grads))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-5, rtol=1e-5)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, atol=1e-4, rtol=1e-3, msg=name)


def test_compile_layers_option():
    assert resolve_compile_layers(None) is False
    assert resolve_compile_layers(True) is True
    with pytest.raises(ValueError, match="compile_layers"):
        resolve_compile_layers(1)
