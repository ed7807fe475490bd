"""The key contract: every schema key is consumed by rl_runtime.compose or declared in
rl_config.contract, and every consumed key changes what compose builds.

"Consumed" is measured, not listed: compose runs on configs wrapped in a tracing proxy that records
each schema field it reads (worker sections per role, `custom_envs.*` per env definition).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pytest

from rl_config.contract import IGNORED, PIPELINE_CONSUMED, UNSUPPORTED, declared, schema_keys
from rl_config.key_reads import KeyReads
from rl_config.loading import compose_config
from rl_config.schema import ExperimentConfig
from rl_runtime.compose import compose
from rl_runtime.compose.envs import PROMPT_KEYS
from rl_runtime.pipelines.rlvr.compose import build_rlvr

ROOT = Path(__file__).resolve().parents[1]
ROLES = ("actor_train", "actor_infer", "reference", "critic")
SHIPPED = [
    ROOT / "apps/agentic/configs/cpu_default.yaml",
    ROOT / "apps/agentic/configs/examples/agentic_val_sokoban.yaml",
]
CRITIC = {
    "adv_estimator": "gae",
    "critic": {
        "training_args": {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4},
        "device_mapping": [0],
        "strategy_args": {"strategy_name": "fsdp2_train", "strategy_config": {}},
    },
}
ALGO = {
    "use_pg_clip_range": True,
    "dual_clip_loss": True,
    "train_infer_correction": {"is_weight": {"enabled": True}},
}
KL = {"init_kl_coef": 0.1, "add_token_level_kl": True, "use_kl_loss": True, "kl_loss_coef": 0.1}


@functools.cache
def _loaded(path: Path) -> dict[str, Any]:
    data = dict(compose_config(path, []).data)
    data.pop("agentic_app", None)
    data.pop("rlvr_app", None)
    return data


def _data(path: Path) -> dict[str, Any]:
    return copy.deepcopy(_loaded(path))


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _variants() -> list[dict[str, Any]]:
    base = _data(SHIPPED[0])
    return [_data(p) for p in SHIPPED] + [
        _merge(base, CRITIC),
        _merge(base, KL),
        _merge(base, ALGO),
    ]


def _consumed() -> set[str]:
    seen: dict[str, set[str]] = {}
    for data in _variants():
        compose(KeyReads(ExperimentConfig.model_validate(data), seen))
    return set(seen)


def test_every_schema_key_is_consumed_or_declared():
    consumed = _consumed()
    keys = schema_keys()
    missing = [k for k in keys if k not in consumed and declared(k, "agentic") is None]
    assert not missing, f"schema keys neither consumed by compose nor declared: {missing}"
    both = sorted(k for k in consumed if declared(k, "agentic") is not None)
    assert not both, f"consumed by compose but declared unsupported/ignored: {both}"
    stale = [p for p in {**UNSUPPORTED, **IGNORED} if not any(_match(k, p) for k in keys)]
    assert not stale, f"contract patterns that match no schema key: {stale}"


def _match(key: str, pattern: str) -> bool:
    from fnmatch import fnmatchcase

    return fnmatchcase(key, pattern)


# A changed value per consumed key (where the default rule below would not validate).
CHANGES: dict[str, Any] = {
    "record_steps": "every:2",
    **{
        f"{r}.model_args.model_config_kwargs": {"max_position_embeddings": 64}
        for r in ("actor_train", "actor_infer", "reference", "critic")
    },
    "rollout_batch_size": 128,
    "train_env_manager.num_env_groups": 32,
    "train_env_manager.group_size": 2,
    "train_env_manager.num_groups_partition": None,
    "val_env_manager.num_env_groups": 64,
    "val_env_manager.num_groups_partition": None,
    "train_env_manager.tags": ["Other"],
    "val_env_manager.tags": ["Other"],
    "custom_envs.*.env_type": "sokoban",
    "custom_envs.*.env_config": {"size": 5},
    "custom_envs.*.agent_system_template": "Play well.",
    "custom_envs.*.agent_template": "{observation} ({actions_left} left)",
    "reward_normalization.grouping": "batch",
    "resume_from_checkpoint": "/tmp/ckpt",
    "checkpoint_config.output_dir": "/tmp/other_ckpt",
    "checkpoint_config.key_file": "/tmp/other.key",
    "render_save_dir": "/tmp/render",
    "tracker_kwargs": {"project": "x"},
    "system_envs": {"A": "1"},
    "pretrain": "/tmp/other_model",
    "adv_estimator": "reinforce",
    "target_kl": 0.05,
    "adaptive_kl_ctrl": False,
    "advantage_clip": 2.0,
    "reward_clip": 10.0,
    "value_clip": 0.3,
    "num_gpus_per_node": 2,
    "num_nodes": 2,
    "node_resources": ["trainer_node"],
    "weight_sync_host": "10.0.0.1",
    "weight_sync_transport": "broadcast",
    "max_tokens_per_step": 6,
    "actor_infer.generating_args.max_new_tokens": 6,
    "actor_infer.generating_args.stop_strings": ["</answer>"],
    "actor_infer.generating_args.top_k": 5,
    "actor_infer.generating_args.temperature": 0.7,
    "actor_train.training_args.lr_scheduler_kwargs": {"min_lr_rate": 0.1},
    "critic.training_args.lr_scheduler_kwargs": {"min_lr_rate": 0.1},
    "actor_train.pg_variant": "gspo",
    "pg_clip_low": 0.1,
    "pg_clip_high": 0.3,
    "use_pg_clip_range": True,
    "dual_clip_c": 5.0,
    "kl_penalty": "k3",
    "kl_loss_type": "k1",
    "loss_agg_mode": "token-mean",
    "train_infer_correction.is_weight.weight_type": "sequence",
    "train_infer_correction.is_weight.upper_bound": 3.0,
    "train_infer_correction.filters": [{"enabled": True}],
    "step_reward_gamma": 0.5,
    "reward_normalization.method": "identity",
    "track_with": "stdout",
    "reference.strategy_args.strategy_name": "fsdp2_train",
    "custom_envs.*.max_steps": 6,
    "actor_infer.num_gpus_per_worker": 2,
    "reference.num_gpus_per_worker": 2,
    "actor_train.training_args.lr_scheduler_type": "cosine",
    "critic.training_args.lr_scheduler_type": "cosine",
    **{
        f"{r}.model_args.attn_implementation": "eager"
        for r in ("actor_train", "critic", "reference")
    },
    **{f"{r}.strategy_args.strategy_config": {"keep_last": 1} for r in ROLES},
    # the HF engine's own option (compose refuses keys the engine does not read)
    "actor_infer.strategy_args.strategy_config": {"max_num_seqs": 8},
    **{f"{r}.device_mapping": [1] for r in ROLES},
    "lambd": 0.5,
    "gamma": 0.5,
    "actor_train.model_args.freeze_module_prefix": "model.layers.0.",
    "critic.model_args.freeze_module_prefix": "model.layers.0.",
    **{f"{r}.model_args.lora_target": "q_proj,v_proj" for r in ("actor_train", "critic")},
    **{f"{r}.model_args.adapter_name_or_path": "/tmp/adapter" for r in ("actor_train", "critic")},
    **{
        f"{r}.model_args.lora_{key}": value
        for r in ("actor_train", "critic")
        for key, value in (("rank", 4), ("alpha", 4.0), ("dropout", 0.1))
    },
}
# keys whose effect shows only together with another key
CONTEXT: dict[str, dict[str, Any]] = {
    # warmup and the decay floor are read by a decaying schedule (constant refuses them)
    **{
        f"{role}.training_args.{key}": {role: {"training_args": {"lr_scheduler_type": "cosine"}}}
        for role in ("actor_train", "critic")
        for key in ("warmup_steps", "warmup_ratio", "lr_scheduler_kwargs")
    },
    "pg_clip_low": {"use_pg_clip_range": True},
    "pg_clip_high": {"use_pg_clip_range": True},
    "dual_clip_c": {"dual_clip_loss": True},
    "train_infer_correction.is_weight.weight_type": {
        "train_infer_correction": {"is_weight": {"enabled": True}}
    },
    "train_infer_correction.is_weight.upper_bound": {
        "train_infer_correction": {"is_weight": {"enabled": True}}
    },
    "target_kl": {"init_kl_coef": 0.1, "add_token_level_kl": True},
    "kl_horizon": {"init_kl_coef": 0.1, "add_token_level_kl": True, "target_kl": 0.05},
    "adaptive_kl_ctrl": {"init_kl_coef": 0.1, "add_token_level_kl": True, "target_kl": 0.05},
    "kl_loss_coef": {"use_kl_loss": True},
    "kl_loss_type": {"use_kl_loss": True},
    "num_nodes": {"num_gpus_per_node": 1},
    "use_pg_clip_range": {"pg_clip_high": 0.28},
    "train_env_manager.num_env_groups": {"train_env_manager": {"num_groups_partition": None}},
    "val_env_manager.num_env_groups": {"val_env_manager": {"num_groups_partition": None}},
    "train_env_manager.tags": {"train_env_manager": {"num_groups_partition": None}},
    "val_env_manager.tags": {"val_env_manager": {"num_groups_partition": None}},
    "actor_train.use_dynamic_batching_in_train": {
        "actor_train": {"max_tokens_per_microbatch_in_train": 1280}
    },
    "critic.use_dynamic_batching_in_train": {
        "critic": {"max_tokens_per_microbatch_in_train": 1280}
    },
    **{f"{r}.device_mapping": {"num_gpus_per_node": 2} for r in ROLES},
    # LoRA's rank, alpha and dropout are read once lora_target turns it on
    **{
        f"{r}.model_args.lora_{key}": {r: {"model_args": {"lora_target": "all-linear"}}}
        for r in ("actor_train", "critic")
        for key in ("rank", "alpha", "dropout")
    },
    # asynchronous training: rollout on its own device
    **{
        key: {"num_gpus_per_node": 2, "actor_infer": {"device_mapping": [1]}}
        for key in ("async.max_staleness", "async_generation_ratio")
    },
    **{
        key: {
            "num_gpus_per_node": 2,
            "actor_infer": {"device_mapping": [1]},
            "async": {"max_staleness": 1},
        }
        for key in ("async.queue_size", "async.partial_rollout")
    },
    "actor_infer.num_gpus_per_worker": {
        "num_gpus_per_node": 2,
        "actor_infer": {"device_mapping": [0, 1]},
    },
    "reference.num_gpus_per_worker": {
        "num_gpus_per_node": 2,
        "reference": {"device_mapping": [0, 1]},
    },
}


def _set(data: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        if part == "*":
            node = next(iter(node.values()))
            continue
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _get(cfg: Any, key: str) -> Any:
    node = cfg
    for part in key.split("."):
        if part == "*":
            node = next(iter(node.values()))
        else:
            node = getattr(node, "async_" if part == "async" else part)
    return node


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 if value else 1
    if isinstance(value, float):
        return value * 0.5 if value else 0.1
    if isinstance(value, str):
        return {"fp32": "bf16", "hf_infer": "vllm", "fsdp2_train": "deepspeed_train"}.get(
            value, value + "_x"
        )
    if isinstance(value, list) and value and isinstance(value[0], int):
        return [*value, max(value) + 1]
    raise AssertionError(f"no default change for {value!r}: add it to CHANGES")


def _base_for(key: str) -> dict[str, Any]:
    base = _data(SHIPPED[0])
    if key.startswith("critic.") or key in ("value_clip", "lambd"):
        base = _merge(base, CRITIC)
    if key.startswith("reference."):
        base = _merge(base, KL)
    if key.endswith(".tags"):
        base["custom_envs"]["Other"] = copy.deepcopy(base["custom_envs"]["FrozenLake"])
    if key == "custom_envs.*.max_steps":
        next(iter(base["custom_envs"].values()))["env_config"].pop("max_steps", None)
    if key == "custom_envs.*.env_type":  # options both env types take (a sokoban env refuses
        env_config = next(iter(base["custom_envs"].values()))["env_config"]  # a grid `size`)
        for option in ("size", "p", "is_slippery", "random_start", "random_goal",
                       "min_path_length"):  # fmt: skip
            env_config.pop(option, None)
    if key.startswith("custom_envs.*.") and key.split(".")[-1] in PROMPT_KEYS:
        env_config = next(iter(base["custom_envs"].values()))["env_config"]
        env_config.pop(PROMPT_KEYS[key.split(".")[-1]], None)  # the ROLL key sets it instead
    return _merge(base, CONTEXT.get(key, {}))


@pytest.mark.parametrize("key", sorted(_consumed() & set(schema_keys())))
def test_every_consumed_key_changes_the_components(key):
    base = _base_for(key)
    before = ExperimentConfig.model_validate(base)
    data = copy.deepcopy(base)
    value = CHANGES[key] if key in CHANGES else _changed(_get(before, key))
    _set(data, key, value)
    after = ExperimentConfig.model_validate(data)
    assert compose(after) != compose(before), f"{key}: {value!r} did not change the components"


# ------------------------------------------------------------------------------------ RLVR
RLVR = ROOT / "apps/rlvr/configs/cpu_default.yaml"
RLVR_VARIANTS: list[dict[str, Any]] = [
    {},
    {"overlong_penalty": {"enable": True, "buffer_length": 4}, "max_len_mask": True,
     "reward_clip": 5.0, "dynamic_sampling": {"enable": False}, "difficulty_mask": True},
    {"actor_train": {"data_args": {"messages": "messages", "file_name": ["a.jsonl", "b.jsonl"],
                                   "domain_interleave_probs": {"math": 1.0}}},
     "rewards": {"math": {"reward_fn": "math_rule"}}},
    {"actor_train": {"data_args": {"prompt": "question", "response": "answer", "tag": "domain"}}},
    _merge(KL, {}),
    ALGO,
    {"actor_train": {"pg_variant": "gspo"}},
    {"use_pg_clip_range": False},
    _merge(CRITIC, {"value_clip": 0.5}),  # PPO with GAE: a critic beside the actor
    VALIDATION := {
        "actor_train": {"data_args": {"eval_file_name": None}},
        "validation": {"data_args": {"file_name": "val.jsonl", "template": "qwen3"},
                       "generating_args": {"temperature": 0.6, "top_p": 0.9, "top_k": 20,
                                           "max_new_tokens": 5, "num_return_sequences": 1,
                                           "stop_strings": ["\n"]},
                       "eval_steps": 30}},
    REWARDS := {"rewards": {
        "math_rule": {"worker_cls": "roll.pipeline.rlvr.rewards.MathRuleRewardWorker",
                      "tag_included": ["gsm8k"], "timeout_s": 5.0},
        "fmt": {"reward_fn": "format", "format_pattern": "^#### \\d+$", "tag_included": ["fmt"]},
        "mine": {"reward_fn": "custom", "tag_included": ["mine"]},
        "mcq": {"reward_fn": "crossthinkqa", "reward_type": "soft", "tag_included": ["mcq"]}},
        "custom_reward_function": {"path": "my_reward.py", "name": "score", "style": "verl",
                                   "reward_kwargs": {"scale": 2}}},
]  # fmt: skip


def _rlvr_consumed() -> tuple[set[str], set[str]]:
    """(keys compose(pipeline="rlvr") or build_rlvr read, keys build_rlvr reads)."""
    seen: dict[str, set[str]] = {}
    own: dict[str, set[str]] = {}
    for extra in RLVR_VARIANTS:
        cfg = ExperimentConfig.model_validate(_merge(_data(RLVR), extra))
        compose(KeyReads(cfg, seen), pipeline="rlvr")
        build_rlvr(KeyReads(cfg, own))
    return set(seen) | set(own), set(own)


def test_rlvr_every_schema_key_is_consumed_or_declared():
    consumed, own = _rlvr_consumed()
    missing = [k for k in schema_keys() if k not in consumed and declared(k, "rlvr") is None]
    assert not missing, f"schema keys neither consumed by the RLVR pipeline nor declared: {missing}"
    both = sorted(k for k in own if declared(k, "rlvr") is not None)
    assert not both, f"read by build_rlvr but declared unsupported/ignored for rlvr: {both}"
    unused = [p for p in PIPELINE_CONSUMED["rlvr"] if not any(_match(k, p) for k in own)]
    assert not unused, f"PIPELINE_CONSUMED['rlvr'] patterns build_rlvr never reads: {unused}"


RLVR_CHANGES: dict[str, Any] = {
    "actor_train.data_args.template": "qwen2_5",
    "actor_train.data_args.file_name": "other.parquet",
    "actor_train.data_args.eval_file_name": "other_test.parquet",
    "actor_train.data_args.prompt": "question",
    "actor_train.data_args.messages": "messages",
    "actor_train.data_args.domain_interleave_probs": {"verl_default": 1.0},  # a reward domain
    "overlong_penalty.buffer_length": 4,
    "actor_infer.generating_args.max_new_tokens": 6,
    "response_length": 6,
    "prompt_truncation": "left",
    "num_return_sequences_in_group": 4,
    "adv_estimator": "remax",  # the plan reads it for the greedy baseline rollout only
    "validation.data_args.file_name": "other_val.jsonl",
    "validation.data_args.template": "qwen2_5",
    "validation.generating_args.top_k": 5,
    "validation.generating_args.stop_strings": ["</answer>"],
    "difficulty_low_threshold": 0.1,
    "difficulty_high_threshold": 0.95,
}
# keys that only check: a wrong value is refused with the key's name
RLVR_REFUSED: dict[str, Any] = {
    "actor_infer.generating_args.num_return_sequences": 3,
    "validation.generating_args.num_return_sequences": 3,
    "validation.eval_steps": 3,
    "eval_steps": 3,  # read by build_rlvr only to check validation.eval_steps against it
}
RLVR_CONTEXT: dict[str, dict[str, Any]] = {
    "actor_infer.generating_args.max_new_tokens": {"response_length": None},
    "num_return_sequences_in_group": {"actor_infer": {"generating_args": {"num_return_sequences": 1}}},
    "sequence_length": {"prompt_length": None},
    "adv_estimator": {"reward_normalization": {"method": "identity"}},  # remax's raw rewards
    "overlong_penalty.enable": {"overlong_penalty": {"buffer_length": 4}},
    "difficulty_low_threshold": {"difficulty_mask": True},
    "difficulty_high_threshold": {"difficulty_mask": True},
    **{key: VALIDATION for key in PIPELINE_CONSUMED["rlvr"] if key.startswith("validation.")},
    "eval_steps": VALIDATION,
}  # fmt: skip
# keys a config writes together (ROLL's `max_new_tokens: ${response_length}`): changed as one
RLVR_LINKED: dict[str, tuple[str, ...]] = {
    "response_length": ("actor_infer.generating_args.max_new_tokens",),
}


REWARD_KEYS = ("rewards.", "custom_reward_function.")


@pytest.mark.parametrize(
    "key",
    sorted(k for k in _rlvr_consumed()[1] & set(schema_keys()) if not k.startswith(REWARD_KEYS)),
)
def test_every_rlvr_key_changes_the_plan(key):
    base = _merge(_data(RLVR), RLVR_CONTEXT.get(key, {}))
    before = ExperimentConfig.model_validate(base)
    data = copy.deepcopy(base)
    changes = {**CHANGES, **RLVR_CHANGES, **RLVR_REFUSED}
    value = changes[key] if key in changes else _changed(_get(before, key))
    _set(data, key, value)
    for linked in RLVR_LINKED.get(key, ()):
        _set(data, linked, value)
    after = ExperimentConfig.model_validate(data)
    if key in RLVR_REFUSED:
        with pytest.raises(ValueError, match=key):
            build_rlvr(after)
        return
    assert build_rlvr(after) != build_rlvr(before), f"{key}: {value!r} did not change the plan"


REWARD_CHANGES: dict[str, Any] = {
    "rewards.math_rule.worker_cls": "roll.pipeline.rlvr.rewards.CodeSandboxRewardWorker",
    "rewards.math_rule.tag_included": ["gsm8k", "math"],
    "rewards.math_rule.timeout_s": 9.0,
    "rewards.fmt.reward_fn": "math_rule",
    "rewards.fmt.format_pattern": "^\\d+$",
    "rewards.mcq.reward_type": "strict",
    "custom_reward_function.path": "other.py",
    "custom_reward_function.name": "other",
    "custom_reward_function.style": "trl",
    "custom_reward_function.reward_kwargs": {"scale": 3},
}


def test_every_reward_key_changes_the_reward_spec():
    """Each rewards/custom_reward_function key the RLVR plan reads changes its reward spec."""
    own = _rlvr_consumed()[1]
    read = sorted(k for k in own & set(schema_keys()) if k.startswith(REWARD_KEYS))
    assert {_pattern(k) for k in REWARD_CHANGES} == set(read)
    base = _merge(_data(RLVR), REWARDS)
    before = build_rlvr(ExperimentConfig.model_validate(base)).rewards
    for key, value in REWARD_CHANGES.items():
        data = copy.deepcopy(base)
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
        after = build_rlvr(ExperimentConfig.model_validate(data)).rewards
        assert after != before, f"{key}: {value!r} did not change the reward spec"


def _pattern(key: str) -> str:
    parts = key.split(".")
    return ".".join([parts[0], "*", *parts[2:]]) if parts[0] == "rewards" else key


def test_install_commands_name_extras_the_workspace_has():
    """Every `uv sync --extra X` that rl_config.extras prints names an extra of the root
    pyproject (the command works as printed in a clone)."""
    import re
    import tomllib

    from rl_config import extras

    root = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    have = set(root["project"]["optional-dependencies"])
    commands = [v for k, v in vars(extras).items() if k.isupper() and isinstance(v, str)]
    named = {m for c in commands for m in re.findall(r"uv sync --extra ([\w-]+)", c)}
    assert named and named <= have, (
        f"extras in install commands missing from the root: {named - have}"
    )


# ------------------------------------------------------------------------- output directories
APP_CONFIGS = sorted((ROOT / "apps").glob("*/configs/*.yaml"))  # not configs/examples: ROLL's
APP_SECTIONS = {
    "agentic": "agentic_app",
    "rlvr": "rlvr_app",
    "dpo": "dpo_app",
    "sft": "sft_app",
    "distill": "distill_app",
}


@pytest.mark.parametrize("path", APP_CONFIGS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_a_shipped_app_config_writes_under_its_output_dir(path: Path, tmp_path: Path) -> None:
    """`uv run apps/X output_dir=DIR` moves everything the run writes (logs, checkpoints,
    renders, generated data) into DIR: a second run with another output_dir must not share
    (and move aside, or resume from) the first run's checkpoints and metrics."""
    from rl_config.loading import load_app_config

    out = tmp_path / "run"
    cfg, _ = load_app_config(
        path, [f"output_dir={out}"], section=APP_SECTIONS[path.parent.parent.name]
    )
    written = {
        "logging_dir": cfg.logging_dir,
        "render_save_dir": cfg.render_save_dir,
        "checkpoint_config.output_dir": cfg.checkpoint_config.output_dir,
        **{
            f"actor_train.data_args.{k}": getattr(cfg.actor_train.data_args, k, None)
            for k in ("file_name", "eval_file_name")
            if path.parent.parent.name in ("dpo", "sft")
        },
        "validation.data_args.file_name": cfg.validation.data_args.file_name
        if cfg.validation
        else None,
    }
    for key, value in written.items():
        for one in value if isinstance(value, list) else [value]:
            if one is not None:
                assert Path(one).is_relative_to(out), f"{path}: {key}={one!r} is outside {out}"


def test_vllm_options_named_by_verl_hints_are_read_by_the_engine():
    """The vLLM strategy_config options rl_config.verl_keys names exist: the engine's defaults,
    enable_sleep_mode (VLLMEngine reads it) and enable_chunked_prefill (a vLLM EngineArgs field,
    passed on as every other)."""
    from rl_config.verl_keys import VERL_SECTIONS
    from rl_rollout.vllm_engine import STRATEGY_DEFAULTS

    prefix = "actor_infer.strategy_args.strategy_config."
    named = {
        key.removeprefix(prefix)
        for pairs in VERL_SECTIONS.values()
        for found in pairs.values()
        for key in found.keys
        if key.startswith(prefix)
    }
    assert named - set(STRATEGY_DEFAULTS) == {"enable_sleep_mode", "enable_chunked_prefill"}
    assert "gpu_memory_utilization" in named and "tensor_parallel_size" in named


def test_an_agentic_model_reward_domain_is_read_and_a_rule_domain_warned():
    """In an agentic config a model reward domain scores episodes at their end: its keys are
    read (no warning); a rule domain's still have no effect there (warned)."""
    from rl_config.contract import contract_issues
    from rl_config.loading import load_app_config

    model = ["rewards.rm.reward_fn=reward_model", "rewards.rm.model_args.model_name_or_path=/m",
             "rewards.rm.device_mapping=[0]", "rewards.rm.tag_included=[x]", "rewards.rm.timeout_s=5"]  # fmt: skip
    rule = ["rewards.m.reward_fn=math_rule", "rewards.m.tag_included=[y]"]
    cfg, _ = load_app_config(ROOT / "apps/agentic/configs/cpu_default.yaml", [*model, *rule],
                             section="agentic_app")  # fmt: skip
    errors, warnings = contract_issues(cfg)
    assert errors == [] and not [w for w in warnings if w.startswith("rewards.rm.")]
    assert sorted(w.split("=")[0] for w in warnings) == [
        "rewards.m.reward_fn",
        "rewards.m.tag_included",
    ]


@pytest.mark.parametrize("app", ["agentic", "rlvr"])
def test_reward_pretrain_is_read_as_the_critics_model_and_warned_about_otherwise(app):
    """`reward_pretrain` is the critic's model where the critic names none (the schema fills
    it in): no warning then; without a critic, or with the critic's own model, it is warned."""
    from rl_config.contract import contract_issues
    from rl_config.loading import load_app_config

    def warned(*overrides: str) -> bool:
        cfg, _ = load_app_config(ROOT / f"apps/{app}/configs/cpu_default.yaml",
                                 ["reward_pretrain=/critic_model", *overrides],
                                 section=f"{app}_app")  # fmt: skip
        return any(w.startswith("reward_pretrain=") for w in contract_issues(cfg)[1])

    critic = ["adv_estimator=gae", "critic.device_mapping=[0]"]
    assert not warned(*critic)
    assert warned()
    assert warned(*critic, "critic.model_args.model_name_or_path=/own")
