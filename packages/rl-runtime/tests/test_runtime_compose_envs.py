"""rl_runtime.compose: environment prompts and templates, engine options and LoRA keys reach
the environments, engines and trained roles, or are refused by name."""

from __future__ import annotations

import re

import pytest
from compose_helpers import _components, _merge

from rl_config.errors import ConfigError

ROLL_TURN = (
    "Turn {turn_idx}:\nObservation:\n{observation}\nYou have {actions_left} actions left. "
    "Max response length: {max_response_length} words (tokens).\n"
)


def test_roll_agent_templates_set_the_envs_prompts():
    """ROLL's `agent_system_template` / `agent_template` are the prompts the built env gives
    the agent loop (system message; each turn's user message, ROLL's placeholders filled)."""
    from rl_runtime.step.envs import make_envs

    envs = {"FL": {"agent_system_template": "Play well.", "agent_template": ROLL_TURN}}
    specs = _components({"custom_envs": envs}).env_specs
    ((env, _seed, _group, _tag),) = make_envs(
        [("g", "FL", 3)],
        {t: {"env_type": s.env_type, "config": s.config} for t, s in specs.items()},
    )
    observation, _ = env.reset()
    assert env.system_prompt() == "Play well."
    assert env.turn_prompt(observation, 0, 32) == (
        f"Turn 0:\nObservation:\n{observation}\nYou have 4 actions left. "
        "Max response length: 32 words (tokens).\n"
    )


@pytest.mark.parametrize(
    ("env", "key", "match"),
    [
        (
            {"agent_template": "{history}\n{observation}"},
            "custom_envs.FL.agent_template",
            r"\{history\} is filled by ROLL's step/GiGPO env managers",
        ),
        (
            {"agent_template": ROLL_TURN, "env_config": {"turn_template": "{observation}"}},
            "custom_envs.FL.agent_template",
            r"disagrees with custom_envs\.FL\.env_config\.turn_template",
        ),
        (
            {"env_type": "single_turn", "agent_template": ROLL_TURN},
            "custom_envs.FL.agent_template",
            r"env type 'single_turn' takes no turn_template \(its prompt options: system_prompt\)",
        ),
        (
            {"env_type": "tool_use", "agent_system_template": "Use tools."},
            "custom_envs.FL.agent_system_template",
            r"takes no system_prompt \(its prompt options: none\)",
        ),
        (
            {"env_type": "webshop"},
            "custom_envs.FL.env_type",
            r"unknown env 'webshop'; tags: .*env types: .*'sokoban'",
        ),
        # env options the env's constructor refuses: at compose, not in a worker after the
        # warm-up (countdown's unknown options were dropped silently)
        (
            {"env_config": {"is_slipery": True}},
            "custom_envs.FL.env_config.is_slipery",
            r"'frozen_lake' takes no option 'is_slipery'; did you mean 'is_slippery'\?",
        ),
        (
            {"env_type": "countdown", "env_config": {"num_numbrs": 3}},
            "custom_envs.FL.env_config.num_numbrs",
            r"did you mean 'num_numbers'\? \(its options: .*max_number, max_steps",
        ),
        (
            {"env_type": "single_turn"},
            "custom_envs.FL.env_config",
            r"env type 'single_turn': SingleTurnEnv needs rows or path",
        ),
        (
            {"env_type": "single_turn", "env_config": {"path": "no_such_file.jsonl"}},
            "custom_envs.FL.env_config",
            r"dataset file not found: no_such_file\.jsonl",
        ),
        (
            {"env_type": "tool_use", "env_config": {"tools": ["shell"]}},
            "custom_envs.FL.env_config",
            r"unknown tools \['shell'\]",
        ),
    ],
)
def test_env_prompts_and_types_compose_cannot_honour_are_refused_by_name(env, key, match):
    with pytest.raises(ConfigError) as info:
        _components({"custom_envs": {"FL": env}})
    (issue,) = info.value.issues
    assert issue.path == key
    assert re.search(match, issue.message), issue.message


def test_vllm_engine_options_are_checked_at_compose_without_vllm():
    """A typo'd or mistyped vllm key failed only when the engine started (vLLM is installed only
    in CI's vLLM step); now compose names each key, with the closest known one for a typo."""

    def infer(options: dict) -> dict:
        return {"actor_infer": {"strategy_args": {"strategy_name": "vllm",
                                                  "strategy_config": options}}}  # fmt: skip

    bad = {"gpu_memory_utilisation": 0.1, "enforce_eager": "yes", "block_size": 16}
    with pytest.raises(ConfigError) as err:
        _components(infer(bad))
    issues = {issue.path.rpartition(".")[2]: issue.message for issue in err.value.issues}
    assert sorted(issues) == ["enforce_eager", "gpu_memory_utilisation"]
    assert "did you mean 'gpu_memory_utilization'?" in issues["gpu_memory_utilisation"]
    assert issues["enforce_eager"] == "is 'yes'; use true or false"
    assert {issue.path for issue in err.value.issues} == {
        "actor_infer.strategy_args.strategy_config.gpu_memory_utilisation",
        "actor_infer.strategy_args.strategy_config.enforce_eager",
    }
    good = {"gpu_memory_utilization": 0.1, "enforce_eager": True, "block_size": 32}
    assert _components(infer(good)).role("actor_infer").strategy_config == good


def test_an_unknown_hf_engine_option_is_a_config_error_at_its_key():
    """The HF engine would refuse it in a rollout worker after Ray and the trainers started."""

    def infer(options: dict) -> dict:
        return {"actor_infer": {"strategy_args": {"strategy_name": "hf_infer",
                                                  "strategy_config": options}}}  # fmt: skip

    with pytest.raises(ConfigError) as err:
        _components(infer({"max_num_seq": 8, "recompute_kv_on_weight_update": False}))
    (issue,) = err.value.issues
    assert issue.path == "actor_infer.strategy_args.strategy_config.max_num_seq"
    assert "did you mean 'max_num_seqs'?" in issue.message
    plan = _components(infer({"recompute_kv_on_weight_update": False})).role("actor_infer")
    assert plan.strategy_config == {"recompute_kv_on_weight_update": False}


LORA_ACTOR = {"actor_train": {"model_args": {"lora_target": "q_proj,v_proj", "lora_rank": 4}}}


def test_lora_keys_reach_the_trained_roles_and_a_base_reference_is_the_actor():
    """ROLL's LoRA keys become actor_train's adapter; a KL to the reference, which is the
    actor's base model, then needs no reference worker (the actor disables its adapter)."""
    from rl_train.lora import LoraSettings

    c = _components(_merge(LORA_ACTOR, {"init_kl_coef": 0.1, "use_kl_loss": True}))
    assert c.role("actor_train").model_args.lora == LoraSettings(
        rank=4, alpha=8.0, target=("q_proj", "v_proj")
    )
    assert c.role("reference") is None and c.reference_from_actor
    assert any("no reference worker starts" in w for w in c.warnings)
    own = _components(
        _merge(
            LORA_ACTOR,
            {"use_kl_loss": True, "reference": {"model_args": {"model_name_or_path": "other"}}},
        )
    )
    assert own.role("reference") is not None and not own.reference_from_actor
    full = _components({"use_kl_loss": True})  # no LoRA: the reference worker as before
    assert full.role("reference") is not None and not full.reference_from_actor
    assert full.role("actor_train").model_args.lora is None
    no_kl = _components(LORA_ACTOR)  # nothing needs a reference
    assert no_kl.role("reference") is None and not no_kl.reference_from_actor


def test_a_lora_key_without_lora_target_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"actor_train\.model_args\.lora_rank is set but"):
        _components({"actor_train": {"model_args": {"lora_rank": 4}}})


def test_weight_syncs_carry_the_adapter_only_to_engines_that_take_it(tmp_path):
    from rl_runtime.compose import role_specs

    (tmp_path / "config.json").write_text("{}")  # a model directory, as role_specs checks

    def adapter_only(extra: dict) -> bool:
        specs = {
            s.role: s
            for s in role_specs(
                _components(_merge(extra, {"pretrain": str(tmp_path)})), str(tmp_path)
            )
        }
        return specs["actor_train"].init_kwargs["sync_adapter_only"]

    assert adapter_only(LORA_ACTOR)  # the HF engine merges the adapter into its base weights
    vllm = {"actor_infer": {"strategy_args": {"strategy_name": "vllm"}}}
    assert not adapter_only(_merge(LORA_ACTOR, vllm))  # vLLM without LoRA: merged weights
    merged = _components(_merge(LORA_ACTOR, vllm))
    assert any("enable_lora is off" in w for w in merged.warnings)
    lora_vllm = {"actor_infer": {"strategy_args": {"strategy_name": "vllm",
                                                   "strategy_config": {"enable_lora": True}}}}  # fmt: skip
    assert adapter_only(_merge(LORA_ACTOR, lora_vllm))  # vLLM loads the adapter by request
    by_request = _components(_merge(LORA_ACTOR, lora_vllm))
    # rank 4 -> the smallest max_lora_rank vLLM takes that holds it
    assert by_request.role("actor_infer").strategy_config == {"enable_lora": True,
                                                              "max_lora_rank": 8}  # fmt: skip
    rank_40 = _merge(lora_vllm, {"actor_train": {"model_args": {"lora_target": "all-linear",
                                                                "lora_rank": 40}}})  # fmt: skip
    assert _components(rank_40).role("actor_infer").strategy_config["max_lora_rank"] == 64
    own = _merge(rank_40, {"actor_infer": {"strategy_args": {"strategy_config": {
        "max_lora_rank": 128}}}})  # fmt: skip
    assert _components(own).role("actor_infer").strategy_config["max_lora_rank"] == 128
    unused = _components(lora_vllm)
    assert any("trains no LoRA adapter" in w for w in unused.warnings)
    assert not adapter_only(lora_vllm)
    assert not adapter_only({})  # no adapter
