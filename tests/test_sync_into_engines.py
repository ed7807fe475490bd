"""rl-sync into rl-rollout engines: a separately started trainer process changes its weights and
syncs them over a standalone gloo group into a live HFEngine; the engine's log-probs then match the
trainer's model (and no longer the original one)."""

import asyncio
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = [pytest.mark.xdist_group("dist"), pytest.mark.slow]  # ~40 s idle, minutes when loaded

TRAINER = textwrap.dedent(
    """
    import sys, torch
    from transformers import AutoModelForCausalLM
    from rl_sync.group import init_group
    from rl_sync.transfer import WeightSender

    torch.set_num_threads(1)
    model_path, out_path = sys.argv[1], sys.argv[2]
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    gen = torch.Generator().manual_seed(123)
    with torch.no_grad():  # stands in for an optimiser step
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save(state, out_path)
    group = init_group("127.0.0.1", 0, 0, 2, timeout_s=60,
                       on_port=lambda port: print(f"PORT {port}", flush=True))
    metrics = WeightSender(group, bucket_bytes=64 << 10).send(state.items(), version=1)
    print(f"SENT {metrics.num_buckets} {metrics.bytes}", flush=True)
    group.close()
    """
)


def _teacher_forced_log_probs(model, ids):
    """log p(ids[t] | ids[:t]) for t >= 1. ids: [T] -> [T-1]"""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_trainer_process_syncs_into_hf_engine_and_log_probs_match(tmp_path):
    from transformers import AutoModelForCausalLM

    from rl_config.records import GenerationRequest, SamplingParams
    from rl_rollout.hf_engine import HFEngine
    from rl_rollout.tiny_model import build_tiny_model
    from rl_sync.group import init_group
    from rl_sync.transfer import WeightReceiver, receive_into_engine

    torch.set_num_threads(1)
    model_path = build_tiny_model(tmp_path / "tiny", seed=0)
    engine = HFEngine(model_path, dtype="float32", device="cpu", seed=0)
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
        group = init_group("127.0.0.1", int(line.split()[1]), 1, 2, timeout_s=60)
        metrics = receive_into_engine(WeightReceiver(group), engine)
        assert trainer.stdout.readline().startswith("SENT ")
        assert trainer.wait(timeout=60) == 0
        group.close()
    finally:
        if trainer.poll() is None:
            trainer.kill()
    assert metrics.version == 1 and engine.weight_version == 1 and metrics.num_buckets > 1

    trainer_state = torch.load(trainer_state_path, weights_only=True)
    engine_state = engine.state_dict_for_check()
    for name, tensor in trainer_state.items():
        assert torch.equal(engine_state[name], tensor), name

    prompt = [3, 17, 42, 9, 5]
    request = GenerationRequest(
        request_id="r0",
        prompt_ids=prompt,
        sampling=SamplingParams(max_new_tokens=8, seed=7, ignore_eos=True),
    )
    (result,) = asyncio.run(engine.generate([request]))
    engine.shutdown()
    assert result.weight_version == 1
    ids = prompt + list(result.output_ids)

    trainer_model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    original = _teacher_forced_log_probs(trainer_model, ids)[len(prompt) - 1 :]
    trainer_model.load_state_dict(trainer_state)
    expected = _teacher_forced_log_probs(trainer_model, ids)[len(prompt) - 1 :]
    got = torch.tensor(result.output_log_probs)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert (got - original).abs().max() > 1e-2  # the sync changed what the engine computes
