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
