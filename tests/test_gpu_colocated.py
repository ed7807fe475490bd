"""Colocated on one GPU: a trainer process updates its weights and hands them to a live HFEngine in
another process through CUDA IPC (rl_sync.ipc); the engine verifies the checksum on the device,
applies, and its generation log-probs then match the trainer's model under teacher forcing.
Runs only with ``-m gpu`` on a CUDA machine."""

import asyncio
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TRAINER = textwrap.dedent(
    """
    import sys, torch
    from transformers import AutoModelForCausalLM
    from rl_sync.group import init_group
    from rl_sync.ipc import IpcSender

    model_path, out_path = sys.argv[1], sys.argv[2]
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to("cuda")
    gen = torch.Generator(device="cuda").manual_seed(123)
    with torch.no_grad():  # stands in for an optimiser step
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen, device="cuda"))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save({k: v.cpu() for k, v in state.items()}, out_path)
    group = init_group("127.0.0.1", 0, 0, 2, backend="gloo", timeout_s=120,
                       on_port=lambda port: print(f"PORT {port}", flush=True))
    sender = IpcSender("cuda:0")
    metrics = sender.send_over(group, state.items(), version=1)
    group.barrier()  # the engine has copied out of the shared buffer
    print(f"SENT {metrics.bytes} {metrics.seconds * 1e3:.2f}ms", flush=True)
    sender.close()
    group.close()
    """
)


def _teacher_forced_log_probs(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids], device="cuda")).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:], device="cuda")[:, None])[
        :, 0
    ]


def test_trainer_process_updates_hf_engine_through_cuda_ipc(tmp_path):
    from transformers import AutoModelForCausalLM

    from rl_config.records import GenerationRequest, SamplingParams
    from rl_rollout.hf_engine import HFEngine
    from rl_rollout.tiny_model import build_tiny_model
    from rl_sync.group import init_group
    from rl_sync.ipc import IpcReceiver

    model_path = build_tiny_model(tmp_path / "tiny", seed=0)
    engine = HFEngine(model_path, dtype="float32", device="cuda", seed=0)
    trainer_state_path = tmp_path / "trainer_state.pt"
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(model_path), str(trainer_state_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert trainer.stdout is not None
        line = trainer.stdout.readline()
        assert line.startswith("PORT "), line
        group = init_group("127.0.0.1", int(line.split()[1]), 1, 2, backend="gloo", timeout_s=120)
        devices: set[str] = set()

        def apply(named):
            devices.update(t.device.type for _, t in named)
            engine.update_weights(named, 1)

        metrics = IpcReceiver("cuda:0").receive_over(group, apply)
        group.barrier()
        sent = trainer.stdout.readline()
        assert sent.startswith("SENT "), sent
        assert trainer.wait(timeout=60) == 0
        group.close()
    finally:
        if trainer.poll() is None:
            trainer.kill()
    assert metrics.version == 1 and engine.weight_version == 1 and devices == {"cuda"}
    trainer_state = torch.load(trainer_state_path, weights_only=True)
    engine_state = engine.state_dict_for_check()
    for name, tensor in trainer_state.items():
        assert torch.equal(engine_state[name].cpu(), tensor), name

    prompt = [3, 17, 42, 9, 5]
    request = GenerationRequest(
        request_id="r0",
        prompt_ids=prompt,
        sampling=SamplingParams(max_new_tokens=12, seed=7, ignore_eos=True),
    )
    (result,) = asyncio.run(engine.generate([request]))
    engine.shutdown()
    ids = prompt + list(result.output_ids)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to("cuda")
    original = _teacher_forced_log_probs(model, ids)[len(prompt) - 1 :].cpu()
    model.load_state_dict({k: v.to("cuda") for k, v in trainer_state.items()})
    expected = _teacher_forced_log_probs(model, ids)[len(prompt) - 1 :].cpu()
    got = torch.tensor(result.output_log_probs)
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-3)
    assert (got - original).abs().max() > 1e-2  # the update changed what the engine computes


@pytest.mark.parametrize("dtype,atol", [("float32", 1e-3), ("bfloat16", 0.1)])
def test_hf_engine_on_cuda_log_probs_match_teacher_forcing(tmp_path, dtype, atol):
    """Batched, KV-cached generation on the GPU reports log-probs of the sampled tokens that a
    full teacher-forced forward of the same model reproduces (bf16: within its rounding)."""
    from transformers import AutoModelForCausalLM

    from rl_config.records import GenerationRequest, SamplingParams
    from rl_rollout.hf_engine import HFEngine
    from rl_rollout.tiny_model import build_tiny_model

    model_path = build_tiny_model(tmp_path / "tiny", seed=0)
    engine = HFEngine(model_path, {"max_num_seqs": 8}, dtype=dtype, device="cuda", seed=0)
    requests = [
        GenerationRequest(
            request_id=f"r{i}",
            prompt_ids=list(range(10 + i, 20 + 3 * i)),
            sampling=SamplingParams(max_new_tokens=24, seed=i, ignore_eos=True),
        )
        for i in range(6)
    ]
    results = asyncio.run(engine.generate(requests))
    engine.shutdown()
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).to("cuda")
    worst = 0.0
    for r in results:
        ids = list(r.prompt_ids) + list(r.output_ids)
        ref = _teacher_forced_log_probs(model, ids)[len(r.prompt_ids) - 1 :].cpu()
        worst = max(worst, (ref - torch.tensor(r.output_log_probs)).abs().max().item())
    print(f"{dtype}: max |engine - teacher-forced| log-prob = {worst:.2e}")
    assert worst < atol
