"""actor_infer.model_args.model_config_kwargs in the engines: the HF engine's model is built with
the overridden config (and derives its length limit from it); vLLM gets the override as
``hf_overrides``, each name checked on the model's config first; an unknown name, an engine
that cannot take an override, or a second source (strategy_config.hf_overrides) are errors
naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_rollout import build_engine

KEY = "actor_infer.model_args.model_config_kwargs"


def test_the_hf_engine_builds_its_model_with_the_override(tiny_model_dir: Path):
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(tiny_model_dir).max_position_embeddings != 48
    eng = build_engine(
        "hf_infer",
        tiny_model_dir,
        {},
        device="cpu",
        config_overrides={"max_position_embeddings": 48},
    )
    try:
        assert eng.model.config.max_position_embeddings == 48
        assert eng.max_model_len == 48  # the limit the engine derives from the model's config
    finally:
        eng.shutdown()
    with pytest.raises(ValueError, match=rf"{KEY}\.max_len: not an attribute"):
        build_engine("hf_infer", tiny_model_dir, {}, device="cpu", config_overrides={"max_len": 4})


def test_vllm_overrides_are_checked_on_the_models_config(tiny_model_dir: Path):
    from rl_rollout.vllm_engine import checked_hf_overrides

    assert checked_hf_overrides(tiny_model_dir, {"max_position_embeddings": 2048}) == {
        "max_position_embeddings": 2048
    }
    with pytest.raises(ValueError, match=rf"{KEY}\.max_len: not an attribute"):
        checked_hf_overrides(tiny_model_dir, {"max_len": 4})
    with pytest.raises(ValueError, match="strategy_config.hf_overrides are both set"):
        checked_hf_overrides(tiny_model_dir, {"max_position_embeddings": 2048}, {"a": 1})


def test_an_engine_without_overrides_refuses_them_by_name(tiny_model_dir: Path):
    from rl_rollout.registry import _ENGINES

    _ENGINES["no_overrides_test"] = lambda path, cfg, *, dtype, device, seed: None
    try:
        with pytest.raises(ValueError, match=f"{KEY}: engine 'no_overrides_test' does not take"):
            build_engine("no_overrides_test", tiny_model_dir, {}, config_overrides={"x": 1})
    finally:
        del _ENGINES["no_overrides_test"]


@pytest.mark.vllm
def test_vllm_builds_its_model_with_the_override(tiny_model_dir: Path):
    pytest.importorskip("vllm")
    eng = build_engine(
        "vllm",
        tiny_model_dir,
        {"max_num_seqs": 4, "max_model_len": 1024},
        dtype="float32",
        config_overrides={"max_position_embeddings": 2048},
    )
    try:
        assert eng.llm.model_config.hf_config.max_position_embeddings == 2048
    finally:
        eng.shutdown()
