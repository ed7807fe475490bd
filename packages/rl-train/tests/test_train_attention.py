"""Attention kernel choice per device and dtype, and the rl_varlen layouts (packed rows, padded
rows) routed through transformers. The flash kernel itself is CUDA-only (see test_train_gpu.py);
here a plain-loop causal attention stands in for it so the index and routing logic is checked
against sdpa on the CPU."""

import itertools
import warnings

import pytest
import torch

import rl_train
import rl_train.modeling
from rl_train import attention
from rl_train.attention import VARLEN, resolve_attn_implementation
from rl_train.testing import make_batch


def test_auto_picks_per_device_and_dtype():
    assert resolve_attn_implementation("auto", "cpu", "bf16") == "sdpa"
    assert resolve_attn_implementation(None, "npu", "bf16") == "sdpa"
    if attention._varlen_fn() is not None:  # torch >= 2.10 ships the varlen kernel
        assert resolve_attn_implementation("auto", "cuda", "bf16") == VARLEN
    assert resolve_attn_implementation("auto", "cuda", "fp32") == "sdpa"  # no fp32 flash kernel
    assert resolve_attn_implementation("sdpa", "cuda", "bf16") == "sdpa"
    assert resolve_attn_implementation("eager", "cpu", "fp32") == "eager"


def test_fa2_falls_back_with_a_warning_naming_the_key():
    with pytest.warns(UserWarning, match=r"model_args\.attn_implementation='fa2'.*cpu.*sdpa"):
        assert resolve_attn_implementation("fa2", "cpu", "bf16") == "sdpa"
    with pytest.warns(UserWarning, match="no fp32 kernel"):
        assert resolve_attn_implementation("flash_attention_2", "cuda", "fp32") == "sdpa"


def test_varlen_off_cuda_and_unknown_names_are_errors():
    with pytest.raises(ValueError, match=r"model_args\.attn_implementation='varlen' needs CUDA"):
        resolve_attn_implementation("varlen", "cpu", "bf16")
    with pytest.raises(ValueError, match="'flash3'"):
        resolve_attn_implementation("flash3", "cuda", "bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a supported choice resolves silently
        resolve_attn_implementation("sdpa", "cpu", "fp32")


def _loop_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, **causal):
    """Plain causal attention per row of ``cu_q``: ``q [N, H, D]``, ``k/v [N, H, D]``."""
    assert causal in ({"is_causal": True}, {"window_size": (-1, 0)})
    out = torch.zeros_like(q)
    bounds = cu_q.tolist()
    for start, end in itertools.pairwise(bounds):
        qs, ks, vs = (x[start:end].transpose(0, 1).float() for x in (q, k, v))
        scores = qs @ ks.transpose(1, 2) * scale
        n = end - start
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        out[start:end] = (scores.softmax(-1) @ vs).transpose(0, 1).to(q.dtype)
    return out


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_varlen_routing_matches_sdpa_through_the_model(tiny_model_path, monkeypatch, packed):
    """rl_varlen (kernel replaced by the loop above) vs sdpa: the same per-token log-probs, for
    one packed row with cu_seq_lens and for right-padded rows with a 2D mask."""
    monkeypatch.setattr(attention, "_varlen_fn", lambda: _loop_varlen)
    monkeypatch.setattr(attention, "_varlen_params", lambda: frozenset({"is_causal"}))
    # the choice is tested above; here the model loads with whatever kernel the test names
    monkeypatch.setattr(rl_train.modeling, "resolve_attn_implementation", lambda req, *_: req)
    batch = make_batch(5, 24, seed=11)
    outs = {}
    attention.register_varlen_attention()
    for attn in (VARLEN, "sdpa"):
        backend = rl_train.build_backend(
            "hf_infer",
            role="reference",
            model_path=tiny_model_path,
            model_args={"dtype": "fp32", "attn_implementation": attn},
            training_args={"use_sequence_packing": packed, "infer_batch_size": 5},
        )
        outs[attn] = backend.forward(batch).log_probs
    assert outs[VARLEN] is not None
    torch.testing.assert_close(outs[VARLEN], outs["sdpa"], atol=1e-5, rtol=1e-5)
