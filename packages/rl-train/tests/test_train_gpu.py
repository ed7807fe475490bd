"""CUDA: the varlen attention kernel, bf16 training steps of every backend against an fp32
reference, and checkpoint resume on the device. Runs only with ``-m gpu`` on a CUDA machine."""

from pathlib import Path

import pytest
import torch

from rl_train.dist import spawn
from rl_train.testing import make_batch, train_worker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ZERO2 = {"zero_optimization": {"stage": 2, "overlap_comm": False}}
ZERO3 = {"zero_optimization": {"stage": 3}}
BACKENDS = [("fsdp2_train", {}), ("deepspeed_train", ZERO2), ("deepspeed_train", ZERO3)]
IDS = ["fsdp2", "zero2", "zero3"]


def _reference_attention(q, k, v, lengths):
    """Plain loop: causal softmax attention per row, ``q [N, H, D]``, ``k/v [N, Hkv, D]``, fp32."""
    out, start = [], 0
    group = q.shape[1] // k.shape[1]
    for n in lengths:
        qs = q[start : start + n].float().transpose(0, 1)  # [H, n, D]
        ks = k[start : start + n].float().repeat_interleave(group, 1).transpose(0, 1)
        vs = v[start : start + n].float().repeat_interleave(group, 1).transpose(0, 1)
        scores = qs @ ks.transpose(1, 2) / qs.shape[-1] ** 0.5
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        out.append((scores.softmax(-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(out)


def test_varlen_attention_packed_and_padded_match_a_plain_loop():
    from rl_train.attention import varlen_attention_forward, varlen_available

    assert varlen_available("cuda"), "torch.nn.attention.varlen is missing from this torch build"
    torch.manual_seed(0)
    lengths = [5, 17, 1, 64]
    n, h, hkv, d = sum(lengths), 4, 2, 64
    q = torch.randn(n, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16)
    expected = _reference_attention(q, k, v, lengths)
    cu = torch.tensor([0, 5, 22, 23, 87], dtype=torch.int32, device="cuda")
    packed, _ = varlen_attention_forward(
        None,  # type: ignore[arg-type]
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        None,
        cu_seq_lens_q=cu,
        max_length_q=64,
    )
    torch.testing.assert_close(packed[0].float(), expected, atol=2e-2, rtol=2e-2)
    # the same rows right-padded to [B, T] with a 2D mask
    t = max(lengths)
    qp = torch.zeros(len(lengths), t, h, d, device="cuda", dtype=q.dtype)
    kp = torch.zeros(len(lengths), t, hkv, d, device="cuda", dtype=q.dtype)
    vp = torch.zeros_like(kp)
    mask = torch.zeros(len(lengths), t, dtype=torch.bool, device="cuda")
    start = 0
    for row, m in enumerate(lengths):
        qp[row, :m], kp[row, :m], vp[row, :m] = (
            q[start : start + m],
            k[start : start + m],
            v[start : start + m],
        )
        mask[row, :m] = True
        start += m
    padded, _ = varlen_attention_forward(
        None,  # type: ignore[arg-type]
        qp.transpose(1, 2),
        kp.transpose(1, 2),
        vp.transpose(1, 2),
        mask,
    )
    torch.testing.assert_close(padded[mask].float(), expected, atol=2e-2, rtol=2e-2)
    assert torch.all(padded[~mask] == 0)


def test_backend_log_probs_with_varlen_equal_sdpa(tiny_model_path):
    """The same packed batch through the actor forward: rl_varlen vs sdpa (block mask), bf16."""
    import rl_train

    batch = make_batch(6, 48, seed=3)
    outs = {}
    for attn in ("varlen", "sdpa"):
        backend = rl_train.build_backend(
            "hf_infer",
            role="reference",
            model_path=tiny_model_path,
            model_args={"dtype": "bf16", "attn_implementation": attn},
            training_args={"use_sequence_packing": True, "infer_batch_size": 6},
        )
        assert backend.device.type == "cuda"
        outs[attn] = backend.forward(batch).log_probs
    torch.testing.assert_close(outs["varlen"], outs["sdpa"], atol=5e-2, rtol=0)


def _spec(out: Path, model: str, strategy: str, cfg: dict, dtype: str, steps: int, **extra):
    out.mkdir(parents=True, exist_ok=True)
    return dict(
        strategy=strategy,
        steps=steps,
        out=str(out),
        batch=dict(n=8, max_len=40, vocab=1000),
        kwargs=dict(
            role="actor",
            model_path=model,
            strategy_config=cfg,
            model_args={"dtype": dtype},
            training_args=dict(
                per_device_train_batch_size=4,
                gradient_accumulation_steps=2,
                learning_rate=1e-3,
                use_sequence_packing=True,
                use_dynamic_batching=True,
                max_tokens_per_microbatch=256,
            ),
        ),
        **extra,
    )


@pytest.fixture(scope="module")
def fp32_reference(tiny_model_path, tmp_path_factory):
    """Two steps of single-process fp32 training on the GPU (hf_infer): the reference."""
    out = tmp_path_factory.mktemp("fp32")
    spawn(train_worker, 1, _spec(out, tiny_model_path, "hf_infer", {}, "fp32", steps=2))
    return torch.load(out / "result_rank0.pt", weights_only=True)


@pytest.mark.parametrize("strategy,cfg", BACKENDS, ids=IDS)
def test_bf16_steps_match_the_fp32_reference(
    tiny_model_path, fp32_reference, tmp_path, strategy, cfg
):
    """bf16 compute: losses within 1% and grad norms within 5% of fp32 training; after two Adam
    steps the whole parameter update has cosine > 0.95 with the fp32 update and a norm within 10%."""
    spawn(train_worker, 1, _spec(tmp_path, tiny_model_path, strategy, cfg, "bf16", steps=2))
    got = torch.load(tmp_path / "result_rank0.pt", weights_only=True)
    for ref, run in zip(fp32_reference["history"], got["history"], strict=True):
        assert "error" not in run, run
        assert run["actor/loss"] == pytest.approx(ref["actor/loss"], rel=1e-2)
        assert run["actor/grad_norm"] == pytest.approx(ref["actor/grad_norm"], rel=5e-2)
    from transformers import AutoModelForCausalLM

    start = dict(AutoModelForCausalLM.from_pretrained(tiny_model_path).named_parameters())
    ref_update = torch.cat(
        [
            (fp32_reference["params"][n].float() - p.detach().float()).reshape(-1)
            for n, p in start.items()
        ]
    )
    run_update = torch.cat(
        [(got["params"][n].float() - p.detach().float()).reshape(-1) for n, p in start.items()]
    )
    cosine = torch.nn.functional.cosine_similarity(ref_update, run_update, dim=0).item()
    ratio = (run_update.norm() / ref_update.norm()).item()
    print(f"{strategy} {cfg}: update cosine {cosine:.4f}, norm ratio {ratio:.4f}")
    # Adam normalises every coordinate, so single coordinates with near-zero gradients may flip
    # under bf16 noise; the update as a whole must point the same way with the same size
    assert cosine > 0.95 and 0.9 < ratio < 1.1, (cosine, ratio)


@pytest.mark.parametrize("strategy,cfg", BACKENDS, ids=IDS)
def test_checkpoint_resume_on_cuda_reproduces_the_uninterrupted_run(
    tiny_model_path, tmp_path, strategy, cfg
):
    ck = tmp_path / "ckpt"
    spawn(train_worker, 1, _spec(tmp_path / "straight", tiny_model_path, strategy, cfg, "bf16", 4))
    spawn(
        train_worker,
        1,
        _spec(
            tmp_path / "first",
            tiny_model_path,
            strategy,
            cfg,
            "bf16",
            2,
            save_at=2,
            ckpt_root=str(ck),
        ),
    )
    spawn(
        train_worker,
        1,
        _spec(tmp_path / "resumed", tiny_model_path, strategy, cfg, "bf16", 4, resume_from=str(ck)),
    )
    straight = torch.load(tmp_path / "straight" / "result_rank0.pt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed" / "result_rank0.pt", weights_only=True)
    assert len(resumed["history"]) == 2
    for a, b in zip(straight["history"][2:], resumed["history"], strict=True):
        assert b["actor/loss"] == a["actor/loss"]
    for name, t in straight["params"].items():
        assert torch.equal(t, resumed["params"][name]), name


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-4), (torch.bfloat16, 6e-2)])
def test_fused_head_on_cuda_matches_the_logits_path(tmp_path, dtype, atol):
    """The compiled LogProbHead over a 151,936-row vocabulary (several chunks of rows) against
    log-softmax over materialised logits: values, entropy and every parameter gradient."""
    from rl_rollout.tiny_model import build_tiny_model
    from rl_train.args import ModelArgs
    from rl_train.modeling import load_model, token_outputs

    path = build_tiny_model(tmp_path / "m", padded_vocab_size=151936)
    batch = make_batch(8, 600, vocab=1000, min_len=500, seed=2)  # ~4.4k tokens: 3 chunks
    args = ModelArgs(attn_implementation="sdpa")
    outs, grads = [], []
    for fused in (False, True):
        model = load_model(path, "actor", args, dtype=dtype, fused_lm_head=fused).cuda()
        out = token_outputs(
            model,
            {k: v.cuda() for k, v in batch.items()},
            role="actor",
            packed=False,
            need_entropy=True,
        )
        assert out.log_probs is not None and out.entropy is not None
        mask = batch["response_mask"].cuda().float()
        adv = batch["advantages"].cuda()
        ((out.log_probs * adv + 0.1 * out.entropy) * mask).sum().backward()
        outs.append(out)
        grads.append({n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(outs[1].log_probs, outs[0].log_probs, atol=atol, rtol=0)
    torch.testing.assert_close(outs[1].entropy, outs[0].entropy, atol=atol, rtol=0)
    for name, ref in grads[0].items():
        got = grads[1][name]
        cosine = torch.nn.functional.cosine_similarity(got.reshape(-1), ref.reshape(-1), dim=0)
        assert cosine > (0.9999 if dtype == torch.float32 else 0.99), (name, cosine.item())
