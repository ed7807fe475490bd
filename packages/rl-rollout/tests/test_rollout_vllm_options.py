"""The vllm engine's strategy_config check, which needs no vLLM (rl_rollout.vllm_options); its
list of vLLM engine args is compared with the installed vLLM's in CI's vLLM step."""

from __future__ import annotations

import dataclasses

import pytest

from rl_rollout.registry import engine_option_problems
from rl_rollout.vllm_engine import STRATEGY_DEFAULTS
from rl_rollout.vllm_options import (
    OPTION_VALUES,
    OWN_OPTIONS,
    SET_BY_ENGINE,
    VLLM_ENGINE_ARGS,
    vllm_option_problems,
)


def test_the_engine_defaults_and_vllm_args_passed_on_are_accepted():
    passed_on = {"disable_custom_all_reduce": True, "swap_space_gb": None}
    assert vllm_option_problems({**STRATEGY_DEFAULTS, "block_size": None}) == {}
    assert set(vllm_option_problems(passed_on)) == {"swap_space_gb"}  # not a vLLM 0.32 arg
    assert vllm_option_problems({"call_timeout_s": 30, "logprobs_mode": "raw_logprobs"}) == {}


def test_an_unknown_key_is_named_with_the_closest_known_one():
    problems = engine_option_problems("vllm", {"gpu_memory_utilisation": 0.1, "enforce_eagr": 1})
    assert sorted(problems) == ["enforce_eagr", "gpu_memory_utilisation"]
    assert "did you mean 'gpu_memory_utilization'?" in problems["gpu_memory_utilisation"]
    assert "did you mean 'enforce_eager'?" in problems["enforce_eagr"]


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("enforce_eager", "yes", "true or false"),
        ("block_size", 0, "a positive integer or null (vLLM's choice)"),
        ("block_size", 16.0, "a positive integer or null (vLLM's choice)"),
        ("max_model_len", True, "a positive integer"),
        ("gpu_memory_utilization", "0.5", "a fraction in (0, 1]"),
        ("tensor_parallel_size", None, "a positive integer"),
        ("call_timeout_s", 0, "a positive number"),
        ("logprobs_mode", "raw_logits", "processed_logprobs or raw_logprobs"),
    ],
)
def test_a_value_of_the_wrong_type_is_named(key, value, expected):
    assert vllm_option_problems({key: value}) == {key: f"is {value!r}; use {expected}"}


def test_a_key_the_engine_sets_itself_is_refused():
    problems = vllm_option_problems({"seed": 3, "model": "other"})
    assert problems["seed"] == "is set by the engine (from the config's seed); remove it"
    assert "model_args.model_name_or_path" in problems["model"]


def test_the_checked_keys_are_vllm_engine_args_or_the_engines_own():
    assert set(OPTION_VALUES) - set(OWN_OPTIONS) <= VLLM_ENGINE_ARGS
    assert set(SET_BY_ENGINE) <= VLLM_ENGINE_ARGS
    assert set(STRATEGY_DEFAULTS) <= VLLM_ENGINE_ARGS


@pytest.mark.vllm
def test_the_engine_args_list_matches_the_installed_vllm():
    """The list is vLLM 0.32.0's AsyncEngineArgs fields; a vLLM upgrade that adds, renames or
    drops one fails here (update VLLM_ENGINE_ARGS and VLLM_VERSION together)."""
    pytest.importorskip("vllm")
    import vllm
    from vllm.engine.arg_utils import AsyncEngineArgs

    from rl_rollout.vllm_compat import vllm_series
    from rl_rollout.vllm_options import VLLM_VERSION

    installed = {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    # the args the engine passes itself exist in every supported release (vllm_compat)
    own = {*SET_BY_ENGINE, *STRATEGY_DEFAULTS, "logprobs_mode", "trust_remote_code",
           "enable_sleep_mode", "kv_cache_memory_bytes"}  # fmt: skip
    assert sorted(own - installed) == []
    if vllm_series(vllm.__version__) != vllm_series(VLLM_VERSION):
        pytest.skip(f"the list is vLLM {VLLM_VERSION}'s; {vllm.__version__} is checked at start")
    assert sorted(installed - VLLM_ENGINE_ARGS) == [] and sorted(VLLM_ENGINE_ARGS - installed) == []
