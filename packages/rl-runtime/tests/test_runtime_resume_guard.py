"""rl_runtime.run.resume_guard: which config changes a resume refuses, warns about, or passes."""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import ClassVar

import pytest

from rl_config.contract import declared, schema_keys
from rl_config.errors import ConfigError
from rl_config.schema import ExperimentConfig
from rl_runtime.run.resume_guard import (
    PIPELINE_RESUME_REFUSED,
    RESUME_NOTED,
    RESUME_REFUSED,
    RESUME_REFUSED_MEMBERS,
    RESUME_SILENT,
    app_record,
    changed_keys,
    check_resume,
    config_record,
    refused_keys,
)

BASE = {
    "pretrain": "m",
    "rollout_batch_size": 4,
    "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["FL"]},
    "custom_envs": {"FL": {"env_type": "frozen_lake"}},
}


def _cfg(**changes: object) -> ExperimentConfig:
    data = {**BASE, **changes}
    return ExperimentConfig.model_validate(data)


def test_changed_keys_descends_mappings_and_names_a_new_section_once():
    old = {"a": {"b": 1, "c": [1, 2]}, "s": None}
    new = {"a": {"b": 2, "c": [1, 2], "d": 0}, "s": {"x": 1, "y": 2}}
    assert list(changed_keys(old, new)) == [
        ("a.b", 1, 2),
        ("a.d", None, 0),
        ("s", None, {"x": 1, "y": 2}),
    ]


def test_unchanged_config_passes_silently():
    saved = config_record(_cfg(resume_from_checkpoint=False))
    assert check_resume(saved, _cfg(resume_from_checkpoint=True), "ck/step-000003") == []


def test_harmless_changes_are_warnings_naming_key_and_values():
    saved = config_record(_cfg(max_steps=3))
    warnings = check_resume(saved, _cfg(max_steps=8, logging_steps=5), "ck/step-000003")
    assert len(warnings) == 2
    assert warnings[0].startswith("max_steps changed since checkpoint ck/step-000003: 3 -> 8")
    assert warnings[1].startswith("logging_steps changed")


def test_a_key_that_applies_in_part_says_so():
    saved = config_record(_cfg(init_kl_coef=0.1, target_kl=0.5))
    (line,) = check_resume(saved, _cfg(init_kl_coef=0.2, target_kl=0.5), "ck")
    assert line.startswith("init_kl_coef changed since checkpoint ck: 0.1 -> 0.2")
    assert "adaptive KL control" in line and "checkpointed coefficient" in line


def test_breaking_changes_are_one_error_naming_each_key():
    saved = config_record(_cfg())
    new = _cfg(
        seed=7,
        adv_estimator="reinforce",
        rollout_batch_size=8,
        train_env_manager={"num_env_groups": 2, "group_size": 4, "tags": ["FL"]},
        max_steps=9,  # harmless: not in the error
    )
    with pytest.raises(ConfigError) as info:
        check_resume(saved, new, "ck/step-000003")
    paths = [i.path for i in info.value.issues]
    assert paths == [
        "seed",
        "rollout_batch_size",
        "adv_estimator",
        "train_env_manager.group_size",
    ]
    seed = info.value.issues[0].message
    assert seed.startswith("42 in checkpoint ck/step-000003, now 7: the env and sampling seeds")
    assert "resume_from_checkpoint: false" in seed


def test_model_strategy_and_a_new_critic_are_refused():
    saved = config_record(_cfg())
    critic = {
        "device_mapping": [0],
        "strategy_args": {"strategy_name": "fsdp2_train", "strategy_config": {}},
    }
    new = _cfg(
        pretrain="other",
        actor_train={"strategy_args": {"strategy_name": "deepspeed_train"}},
        critic=critic,
    )
    with pytest.raises(ConfigError) as info:
        check_resume(saved, new, "ck")
    paths = {i.path for i in info.value.issues}
    assert {"pretrain", "actor_train.strategy_args.strategy_name", "critic"} <= paths
    assert "{...}" in next(i.message for i in info.value.issues if i.path == "critic")


def test_a_checkpoint_without_a_config_is_one_warning():
    (line,) = check_resume(None, _cfg(), "ck/step-000001")
    assert "records no config" in line


def _refused(saved: ExperimentConfig, new: ExperimentConfig) -> list[str]:
    with pytest.raises(ConfigError) as info:
        check_resume(config_record(saved), new, "ck")
    return [i.path for i in info.value.issues]


def test_what_the_training_prompts_derive_from_is_refused_and_validation_keys_warn():
    """The prompt sampler's rows and order derive from the data files, columns, template,
    prompt_length (prompts that fit) and domain mix: each change is refused by name; held-out
    keys only warn."""
    data = {"file_name": "train.parquet", "eval_file_name": "val.parquet"}
    saved = _cfg(actor_train={"data_args": data})
    new = _cfg(
        prompt_length=64,
        actor_train={"data_args": {**data, "template": "qwen2_5", "tag": "kind",
                                   "domain_interleave_probs": {"math": 1.0}}},
    )  # fmt: skip
    assert _refused(saved, new) == [
        "prompt_length",
        "actor_train.data_args.template",
        "actor_train.data_args.tag",
        "actor_train.data_args.domain_interleave_probs",
    ]
    held_out = _cfg(
        actor_train={"data_args": {**data, "eval_file_name": "other.parquet"}}, val_batch_size=9
    )
    lines = check_resume(config_record(saved), held_out, "ck")
    assert [x.split(" ")[0] for x in lines] == [
        "val_batch_size",
        "actor_train.data_args.eval_file_name",
    ]


def test_a_member_of_a_mapping_valued_key_changed_is_judged_as_the_key():
    """`changed_keys` names a changed member (`...domain_interleave_probs.math`); the domain mix,
    the model's config kwargs and an env's config are each one value, refused as the key is, and
    a pipeline that ignores the key only warns."""
    mix = {"file_name": "train.parquet", "domain_interleave_probs": {"math": 0.5, "code": 0.5}}
    saved = _cfg(actor_train={"data_args": mix})
    remixed = {**mix, "domain_interleave_probs": {"math": 0.9, "code": 0.1}}
    assert _refused(saved, _cfg(actor_train={"data_args": remixed})) == [
        "actor_train.data_args.domain_interleave_probs.math",
        "actor_train.data_args.domain_interleave_probs.code",
    ]
    shaped = _cfg(actor_train={"model_args": {"model_config_kwargs": {"num_hidden_layers": 2}}})
    assert _refused(_cfg(), shaped) == [
        "actor_train.model_args.model_config_kwargs.num_hidden_layers"
    ]
    dpo_mix = {**DPO["actor_train"], "data_args": {**DPO["actor_train"]["data_args"], **mix}}
    dpo_remix = {**dpo_mix, "data_args": {**dpo_mix["data_args"], **remixed}}
    lines = check_resume(
        config_record(_dpo(actor_train=dpo_mix)), _dpo(actor_train=dpo_remix), "ck", pipeline="dpo"
    )
    assert len(lines) == 2 and all("not read by the dpo pipeline" in x for x in lines)


def test_a_reward_domain_added_or_removed_or_retagged_is_refused_its_scoring_warns():
    math = {"worker_cls": "math_rule", "tag_included": ["math"]}
    saved = _cfg(rewards={"math": math})
    code = {"worker_cls": "code_sandbox", "tag_included": ["code"]}
    assert _refused(saved, _cfg(rewards={"math": math, "code": code})) == ["rewards.code"]
    assert _refused(saved, _cfg()) == ["rewards.math"]  # every domain removed
    retagged = _cfg(rewards={"math": {**math, "tag_included": ["gsm8k"]}})
    assert _refused(saved, retagged) == ["rewards.math.tag_included"]
    (line,) = check_resume(
        config_record(saved), _cfg(rewards={"math": {**math, "timeout_s": 3.0}}), "ck"
    )
    assert line.startswith("rewards.math.timeout_s changed since checkpoint ck")
    assert set(RESUME_REFUSED_MEMBERS) <= {k.split(".")[0] for k in schema_keys()}


@pytest.mark.parametrize(
    "before, after", [(None, "model.embed_tokens"), ("model.embed_tokens", None)]
)
def test_freezing_other_parameters_is_refused(before, after):
    saved = _cfg(actor_train={"model_args": {"freeze_module_prefix": before}})
    new = _cfg(actor_train={"model_args": {"freeze_module_prefix": after}})
    with pytest.raises(ConfigError) as info:
        check_resume(config_record(saved), new, "ck")
    (issue,) = info.value.issues
    assert issue.path == "actor_train.model_args.freeze_module_prefix"
    assert "optimizer state" in issue.message


@pytest.mark.parametrize("key", ["agent_template", "agent_system_template"])
def test_rolls_env_prompt_keys_are_refused_like_the_env_config(key):
    """ROLL's prompt keys set the env's prompts (rl_runtime.compose.envs), as env_config does."""
    new = _cfg(custom_envs={"FL": {"env_type": "frozen_lake", key: "{observation}"}})
    with pytest.raises(ConfigError) as info:
        check_resume(config_record(_cfg()), new, "ck")
    (issue,) = info.value.issues
    assert issue.path == f"custom_envs.FL.{key}" and "task" in issue.message


def test_the_app_section_is_compared_by_the_same_rules():
    @dataclass
    class Arith:
        seed: int = 0
        out_dir: str = "d"

    @dataclass
    class Warmup:
        steps: int = 2

    @dataclass
    class App:
        SECTION: ClassVar[str] = "rlvr_app"
        use_ray: bool = True
        arith_data: Arith = field(default_factory=Arith)
        warmup: Warmup = field(default_factory=Warmup)

    saved = app_record(App())
    assert saved == {"rlvr_app": {"use_ray": True, "arith_data": {"seed": 0, "out_dir": "d"},
                                  "warmup": {"steps": 2}}}  # fmt: skip
    cfg = config_record(_cfg())
    with pytest.raises(ConfigError) as info:
        check_resume(cfg, _cfg(), "ck", saved_app=saved, app=app_record(App(arith_data=Arith(1))))
    assert [i.path for i in info.value.issues] == ["rlvr_app.arith_data.seed"]
    assert "training prompts" in info.value.issues[0].message
    new = app_record(App(use_ray=False, arith_data=Arith(out_dir="e"), warmup=Warmup(5)))
    lines = check_resume(cfg, _cfg(), "ck", saved_app=saved, app=new)
    assert [x.split(" ")[0] for x in lines] == [
        "rlvr_app.use_ray", "rlvr_app.arith_data.out_dir", "rlvr_app.warmup.steps"]  # fmt: skip
    assert "does not repeat it" in lines[2] and "continues with the new value" in lines[0]
    # a checkpoint from before apps' sections were recorded: one warning, no comparison
    (line,) = check_resume(cfg, _cfg(), "ck", saved_app=None, app=new)
    assert line == "checkpoint ck records no rlvr_app section; its changed keys cannot be checked"
    assert check_resume(cfg, _cfg(), "ck", saved_app=None, app={}) == []  # no app section


def _app_pattern(pattern: str) -> bool:
    return pattern.split(".")[0].endswith("_app")


def test_every_pattern_names_schema_keys():
    """(Patterns of the apps' own sections: tests/test_resume_app_sections.py.)"""
    keys = schema_keys()
    for pattern in (*RESUME_REFUSED, *RESUME_SILENT, *RESUME_NOTED):
        if _app_pattern(pattern):
            continue
        assert any(fnmatchcase(k, pattern) or k.startswith(pattern + ".") for k in keys), pattern


DPO = {"pretrain": "m", "loss_type": "sigmoid", "chosen_key": "chosen", "sequence_length": 256,
       "actor_train": {"data_args": {"file_name": "pairs.jsonl"},
                       "training_args": {"per_device_train_batch_size": 2}}}  # fmt: skip


def _dpo(**changes: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate({**DPO, **changes})


def test_a_resume_refuses_what_the_resumed_pipeline_reads():
    """DPO's pairs derive from sequence_length and truncation_mode (which pairs fit, how they
    are cut) and each step's batch from the batch sizes: refused by name for a DPO resume; the
    prompt_length DPO does not read only warns, saying so. An agentic resume likewise passes
    prompt_length and a reward domain (RLVR's), and still refuses its own keys."""
    saved = config_record(_dpo())
    assert _dpo().pipeline_kind == "dpo"
    new = _dpo(sequence_length=512, truncation_mode="drop", prompt_length=64,
               actor_train={**DPO["actor_train"], "training_args": {
                   "per_device_train_batch_size": 4}})  # fmt: skip
    with pytest.raises(ConfigError) as info:
        check_resume(saved, new, "ck", pipeline="dpo")
    issues = {i.path: i.message for i in info.value.issues}
    assert sorted(issues) == [
        "actor_train.training_args.per_device_train_batch_size",
        "sequence_length",
        "truncation_mode",
    ]
    assert "the preference pairs and each step's batch derive from it" in issues["sequence_length"]
    (line,) = check_resume(saved, _dpo(prompt_length=64), "ck", pipeline="dpo")
    assert line.startswith("prompt_length changed since checkpoint ck: None -> 64")
    assert "not read by the dpo pipeline" in line
    mix = {**DPO["actor_train"], "data_args": {"file_name": "pairs.jsonl",
                                               "domain_interleave_probs": {"a": 1.0}}}  # fmt: skip
    (line,) = check_resume(saved, _dpo(actor_train=mix), "ck", pipeline="dpo")  # a mapping value
    assert line.startswith("actor_train.data_args.domain_interleave_probs changed")
    # agentic: RLVR's keys warn, its own are refused
    math = {"worker_cls": "math_rule", "tag_included": ["math"]}
    lines = check_resume(
        config_record(_cfg()), _cfg(prompt_length=64, rewards={"math": math}), "ck",
        pipeline="agentic",
    )  # fmt: skip
    assert [x.split(" ")[0] for x in lines] == ["prompt_length", "rewards.math"]
    with pytest.raises(ConfigError) as info:
        check_resume(config_record(_cfg()), _cfg(rollout_batch_size=8, prompt_length=64), "ck",
                     pipeline="agentic")  # fmt: skip
    assert [i.path for i in info.value.issues] == ["rollout_batch_size"]
    # RLVR reads prompt_length; without a pipeline every table applies
    for kind in ("rlvr", None):
        with pytest.raises(ConfigError) as info:
            check_resume(config_record(_cfg()), _cfg(prompt_length=64), "ck", pipeline=kind)
        assert [i.path for i in info.value.issues] == ["prompt_length"]
    assert "sequence_length" in refused_keys(None) and "sequence_length" not in refused_keys("rlvr")


def test_every_pipelines_refused_keys_are_keys_it_reads():
    """A pipeline's own refused patterns name schema keys that pipeline does not declare
    ignored (rl_config.contract): a refusal of a key the run does not read cannot creep in."""
    keys = schema_keys()
    for kind, table in PIPELINE_RESUME_REFUSED.items():
        for pattern in table:
            matched = [k for k in keys if fnmatchcase(k, pattern)]
            assert matched, pattern
            assert all(declared(k, kind) is None for k in matched), (kind, pattern)


def test_a_changed_derived_value_is_refused_once_by_its_name():
    """RLVR's prompt budget is `prompt_length`, else `sequence_length - response_length`: with
    prompt_length unset, a changed sequence_length changes which prompts fit, though no refused
    key changed. The pipeline's derived record catches it (`derived.prompt_length`); a changed
    prompt_length itself is refused once, by its own name; an older checkpoint without the
    record is one warning."""
    same = {"sequence_length": 512, "response_length": 32,
            "actor_infer": {"generating_args": {"max_new_tokens": 32}}}  # fmt: skip
    saved = config_record(_cfg(**same))
    new = _cfg(**{**same, "sequence_length": 256})
    with pytest.raises(ConfigError) as info:
        check_resume(saved, new, "ck", pipeline="rlvr", saved_derived={"prompt_length": 480},
                     derived={"prompt_length": 224})  # fmt: skip
    (issue,) = info.value.issues
    assert issue.path == "derived.prompt_length"
    assert issue.message.startswith("480 in checkpoint ck, now 224: the prompt budget")
    with pytest.raises(ConfigError) as info:
        check_resume(config_record(_cfg(prompt_length=480)), _cfg(prompt_length=224), "ck",
                     pipeline="rlvr", saved_derived={"prompt_length": 480},
                     derived={"prompt_length": 224})  # fmt: skip
    assert [i.path for i in info.value.issues] == ["prompt_length"]
    lines = check_resume(saved, _cfg(**same), "ck", pipeline="rlvr", saved_derived=None,
                         derived={"prompt_length": 480})  # fmt: skip
    assert lines == ["checkpoint ck records no derived values (prompt_length); their changes "
                     "cannot be checked"]  # fmt: skip
