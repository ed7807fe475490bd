"""Resume safety: the config a checkpoint was written under, against the config resuming it.

A checkpoint records its run's resolved config (secrets redacted, `config_record`) and the app's
own section (`app_record`: `rlvr_app:`, `agentic_app:`, `dpo_app:`). On resume, `check_resume`
compares both key by key with the new ones, by the same rules:

* a changed key matching `RESUME_REFUSED` (model and architecture, training strategy and ranks,
  which parameters train, the seed and batch/group sizes that the env and sampling seeds derive
  from, what the training prompts and their order derive from, the estimator ...), or a member
  added to or removed from a section of `RESUME_REFUSED_MEMBERS` (a reward domain), is refused:
  one `ConfigError` naming every such key, its checkpointed and its new value;
* a key in `RESUME_SILENT` (`resume_from_checkpoint` itself) is not reported;
* a key in `RESUME_NOTED` is a warning saying how much of the new value applies;
* any other changed key is a warning naming it (`max_steps`, `logging_steps`, a learning rate):
  the run continues with the new value. That is so for what the checkpoint restores too: the
  trainers' optimizer and LR schedule keep only what training accumulated (Adam's moments, the
  schedule's position) and take every configured setting again (rl_train.optim
  `apply_configured_settings`: learning rate, betas, epsilon, weight decay, schedule type,
  warm-up, floor, horizon); the reward KL controller keeps only an adaptive coefficient
  (rl_runtime.step.advantages `restore_kl_controller`).

What is refused depends on the pipeline resumed (`check_resume(..., pipeline=)`: agentic, rlvr,
dpo): a key that pipeline does not read (rl_config.contract declares it ignored for that kind:
`prompt_length` in an agentic or DPO run, a critic in a DPO run) only warns, and
`PIPELINE_RESUME_REFUSED` adds the keys only that pipeline's data derives from (DPO's pair
lengths: `sequence_length` and `truncation_mode` decide which pairs are kept and how they are cut;
its batch sizes, which pairs each step trains on). Without a pipeline every table applies.

A pipeline may also record values it derives from several keys and reads for its data (`derived`,
`RunOptions.derived`: RLVR's prompt budget, `prompt_length` or else `sequence_length -
response_length`, which decides which prompts fit); any change of one is refused as
`derived.<name>` (`DERIVED_REFUSED` says why), so a resume that changes `sequence_length` under
an unset `prompt_length` is refused although no refused key changed.

Keys are dotted paths as in the YAML (an app key under its section: `rlvr_app.arith_data.seed`);
patterns are `fnmatch` patterns (`*` spans dots). A section that appears or disappears (a critic
added) is one key, the section's name. A checkpoint that records no config, or no app section
(written before they were recorded), resumes with one warning each.

`check_resume_step(step, max_steps, checkpoint)`: a checkpoint past `max_steps` is refused (a
`ConfigError` naming max_steps and the checkpoint's step: raise max_steps); one at `max_steps`
(a finished run resumed) gives the line saying nothing is trained.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from rl_config.errors import ConfigError, ConfigIssue

_TRAINED = ("actor_train", "critic")
_DATA_ARGS = ("file_name", "template", "prompt", "messages", "response", "tag",
              "domain_interleave_probs")  # fmt: skip
_PROMPT_KEYS = ("prompt_length", "chosen_key", "rejected_key", "label_key", "completion_key",
                "truncation_mode")  # fmt: skip
_ARITH_DATA = ("kind", "num_digits", "max_a", "max_b", "val_fraction", "seed")
_MODEL = "the checkpoint holds weights of another model"
_RANKS = "the trainer's checkpoint is sharded over the role's ranks and strategy"
_FROZEN = (
    "the checkpointed optimizer state covers exactly the parameters that trained then; resuming "
    "with other trainable parameters is not supported (an unfrozen parameter has no optimizer "
    "state to load)"
)
_PROMPTS = (
    "the training prompts and their order derive from it (the rows read, how each is rendered "
    "and whether it fits); the checkpointed sampler position would not continue them"
)
_OBJECTIVE = "the checkpointed policy (and critic) were trained for another objective"
_SEEDS = (
    "the env and sampling seeds of each step derive from it; the resumed run would not "
    "continue the checkpointed one"
)

RESUME_REFUSED: dict[str, str] = {
    "pretrain": _MODEL,
    **{
        f"{r}.model_args.{k}": _MODEL
        for r in _TRAINED
        for k in (
            "model_name_or_path",
            "model_type",
            "num_labels",
            "model_config_kwargs",
        )
    },
    **{f"{r}.strategy_args*": _RANKS for r in _TRAINED},
    **{f"{r}.device_mapping": _RANKS for r in _TRAINED},
    **{f"{r}.world_size": _RANKS for r in _TRAINED},
    "critic": "a critic added or removed: its weights and optimizer are in the checkpoint, or not",
    "seed": _SEEDS,
    "rollout_batch_size": _SEEDS,
    "num_return_sequences_in_group": _SEEDS,
    "train_env_manager.num_env_groups": _SEEDS,
    "train_env_manager.group_size": _SEEDS,
    "train_env_manager.group_size_redundancy": _SEEDS,
    "train_env_manager.tags": _SEEDS,
    "train_env_manager.num_groups_partition": _SEEDS,
    "custom_envs.*.env_type": "the task of the checkpointed run changes",
    "custom_envs.*.env_config": "the task of the checkpointed run changes",
    "custom_envs.*.agent_template": "the task of the checkpointed run changes (its prompts)",
    "custom_envs.*.agent_system_template": "the task of the checkpointed run changes (its prompts)",
    **{f"{r}.model_args.freeze_module_prefix": _FROZEN for r in _TRAINED},
    **{
        f"{r}.model_args.{k}": "the checkpoint holds another LoRA adapter's weights (or none)"
        for r in _TRAINED
        for k in ("lora_target", "lora_rank", "adapter_name_or_path")
    },
    # RLVR/DPO: which rows are read (files, columns, reward domains by tag), how each prompt is
    # rendered (template) and whether it fits (prompt_length), the mix per batch; DPO's pairs
    **{f"actor_train.data_args.{k}": _PROMPTS for k in _DATA_ARGS},
    **{k: _PROMPTS for k in _PROMPT_KEYS},
    "rewards": _PROMPTS,
    "rewards.*.tag_included": _PROMPTS,
    # the apps' own sections: the model they build, the data they generate
    "*_app.build_tiny_model": _MODEL,
    "*_app.tiny_model.*": _MODEL,
    **{f"rlvr_app.arith_data.{k}": _PROMPTS for k in _ARITH_DATA},
    "dpo_app.arithmetic.*": _PROMPTS,
    "sft_app.arithmetic.*": _PROMPTS,
    "adv_estimator": _OBJECTIVE,
}
"""Keys whose change breaks a resume -> why (refused, each named)."""

_PAIRS = (
    "the preference pairs and each step's batch derive from it (which pairs fit and how they are "
    "cut; step k trains on the k-th slice of `examples_per_step` pairs of the seeded epoch "
    "order); the resumed run would not continue at the checkpointed run's next batch"
)

_SFT_ROWS = (
    "the training examples and each step's batch derive from it (which rows load, how they are "
    "tokenized and cut; step k trains on the k-th slice of the seeded epoch order); the resumed "
    "run would not continue at the checkpointed run's next batch"
)

PIPELINE_RESUME_REFUSED: dict[str, dict[str, str]] = {
    "sft": {
        "sequence_length": _SFT_ROWS,
        "prompt_key": _SFT_ROWS,
        "query_key": _SFT_ROWS,
        "response_key": _SFT_ROWS,
        "system_key": _SFT_ROWS,
        "global_template": _SFT_ROWS,
        "actor_train.training_args.per_device_train_batch_size": _SFT_ROWS,
        "actor_train.training_args.gradient_accumulation_steps": _SFT_ROWS,
    },
    "dpo": {
        "sequence_length": _PAIRS,
        "truncation_mode": _PAIRS,
        "actor_train.training_args.per_device_train_batch_size": _PAIRS,
        "actor_train.training_args.gradient_accumulation_steps": _PAIRS,
        "loss_type": _OBJECTIVE + " (kto reads unpaired rows)",
        "ipo": _OBJECTIVE,
    },
}
"""Per pipeline kind: keys refused on top of `RESUME_REFUSED` when resuming that pipeline."""

DERIVED_REFUSED: dict[str, str] = {
    "prompt_length": "the prompt budget (prompt_length, else sequence_length - response_length) "
    "decides which training prompts fit: " + _PROMPTS,
}
"""Derived values (`RunOptions.derived`) -> why a change is refused (others: `_PROMPTS`)."""

RESUME_REFUSED_MEMBERS: dict[str, str] = {"rewards": _PROMPTS}
"""Sections whose members are named by the user (a reward domain) -> why a member added or
removed (the key `rewards.<domain>`) is refused; changes inside a member follow `RESUME_REFUSED`."""

MAPPING_VALUED: tuple[str, ...] = (
    "*.model_args.model_config_kwargs",
    "actor_train.data_args.domain_interleave_probs",
    "custom_envs.*.env_config",
)
"""Keys whose value is a mapping read as one value: a change of a member (`changed_keys` names
`<key>.<member>`) is judged as a change of the key (refused or ignored as the key is)."""

RESUME_SILENT: tuple[str, ...] = ("resume_from_checkpoint",)
"""Keys that differ on every resume by design: not reported."""

RESUME_NOTED: dict[str, str] = {
    "init_kl_coef": (
        "the run continues with the new value, except under adaptive KL control (target_kl "
        "set, in the checkpoint and now), which continues from its checkpointed coefficient"
    ),
    "*_app.warmup.*": "the warm-up ran before the checkpoint; a resumed run does not repeat it",
    "*_app.eval_before_training": (
        "the evaluation before training ran (or not) before the checkpoint; a resumed run keeps "
        "the checkpointed one"
    ),
}
"""Keys whose new value applies only in part on resume -> what happens (a warning)."""

_APPLIES = "the run continues with the new value"


def config_record(cfg: Any) -> dict[str, Any]:
    """The resolved config as JSON data, secrets redacted (what a checkpoint records)."""
    from rl_config.redact import redact

    data = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    return json.loads(json.dumps(redact(data), default=str))


def app_record(app: Any) -> dict[str, Any]:
    """An app's own options (a dataclass naming its YAML section in `SECTION`) as JSON data
    under that section's name, `{"rlvr_app": {...}}` (what a checkpoint records next to the
    config); {} for None."""
    from dataclasses import asdict

    if app is None:
        return {}
    return json.loads(json.dumps({app.SECTION: asdict(app)}, default=str))


def changed_keys(old: Any, new: Any, prefix: str = "") -> Iterator[tuple[str, Any, Any]]:
    """`(dotted key, old value, new value)` of every leaf that differs; mappings are descended
    into, anything else (lists included) is a leaf; a missing key reads as None."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in dict.fromkeys([*old, *new]):
            path = f"{prefix}.{key}" if prefix else str(key)
            yield from changed_keys(old.get(key), new.get(key), path)
    elif old != new:
        yield prefix, old, new


def _show(value: Any) -> str:
    """A value for a message: a section as `{...}`, long values cut."""
    text = "{...}" if isinstance(value, Mapping) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def refused_keys(pipeline: str | None) -> dict[str, str]:
    """The refused key patterns -> why, for resuming a `pipeline` run (None: every pipeline's)."""
    extra = (
        PIPELINE_RESUME_REFUSED.values()
        if pipeline is None
        else [PIPELINE_RESUME_REFUSED.get(pipeline, {})]
    )
    return {k: why for table in (RESUME_REFUSED, *extra) for k, why in table.items()}


def unread_by(pipeline: str | None, key: str, section: bool) -> str | None:
    """Why a `pipeline` run does not read `key` (rl_config.contract declares it ignored for that
    kind; a `section` that appears or disappears, or a mapping value: it or its members), or
    None."""
    if pipeline is None:
        return None
    from rl_config.contract import declared

    names = [key, f"{key}.*"] if section else [key]
    for name in (*names, *_mapping_ancestors(key)):
        found = declared(name, pipeline)
        if found is not None and found[0] == "ignored":
            return found[1]
    return None


def _mapping_ancestors(key: str) -> list[str]:
    """The ancestors of `key` that are `MAPPING_VALUED` keys (nearest first)."""
    parts = key.split(".")
    ancestors = (".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1))
    return [a for a in ancestors if any(fnmatchcase(a, p) for p in MAPPING_VALUED)]


def _reason(key: str, refused: Mapping[str, str]) -> str | None:
    section, _, member = key.rpartition(".")
    if section in RESUME_REFUSED_MEMBERS and member:
        return RESUME_REFUSED_MEMBERS[section]
    names = (key, *_mapping_ancestors(key))
    return next((why for p, why in refused.items() for name in names if fnmatchcase(name, p)), None)


def _refusal(key: str, old: Any, new: Any, checkpoint: str, why: str) -> ConfigIssue:
    return ConfigIssue(
        key,
        f"{_show(old)} in checkpoint {checkpoint}, now {_show(new)}: {why}. Resume with the "
        "checkpointed value, or start a new run (resume_from_checkpoint: false and another "
        "checkpoint_config.output_dir)",
    )


def check_resume(
    saved: Mapping[str, Any] | None,
    cfg: Any,
    checkpoint: str,
    *,
    saved_app: Mapping[str, Any] | None = None,
    app: Mapping[str, Any] | None = None,
    pipeline: str | None = None,
    saved_derived: Mapping[str, Any] | None = None,
    derived: Mapping[str, Any] | None = None,
) -> list[str]:
    """Warnings for the keys changed since `checkpoint` was written under the config `saved`
    and the app section `saved_app` (both as the checkpoint recorded them: `config_record`,
    `app_record`), against the config `cfg` and the app record `app`; raises `ConfigError`
    naming every key refused for resuming a `pipeline` run (agentic, rlvr, dpo; None: refused
    for any), and every changed value of the pipeline's `derived` record against the
    checkpoint's (`saved_derived`). A record the checkpoint lacks (written before it was
    recorded) is one warning; no `app` (a run without an app section) checks the config only."""
    warnings: list[str] = []
    pairs: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = []
    if saved is None:
        warnings.append(
            f"checkpoint {checkpoint} records no config; changed keys cannot be checked"
        )
    else:
        pairs.append((saved, config_record(cfg)))
    if app and saved_app is not None:
        pairs.append((saved_app, app))
    elif app:
        warnings.append(
            f"checkpoint {checkpoint} records no {', '.join(app)} section; its changed keys "
            "cannot be checked"
        )
    refused: list[ConfigIssue] = []
    table = refused_keys(pipeline)
    changes = [change for old_new in pairs for change in changed_keys(*old_new)]
    for key, old, new in changes:
        if any(fnmatchcase(key, p) for p in RESUME_SILENT):
            continue
        unread = unread_by(pipeline, key, isinstance(old, Mapping) or isinstance(new, Mapping))
        why = None if unread is not None else _reason(key, table)
        if why is None:
            note = next((n for p, n in RESUME_NOTED.items() if fnmatchcase(key, p)), _APPLIES)
            if unread is not None:
                note = f"not read by the {pipeline} pipeline: {unread}"
            warnings.append(
                f"{key} changed since checkpoint {checkpoint}: {_show(old)} -> {_show(new)} "
                f"({note})"
            )
        else:
            refused.append(_refusal(key, old, new, checkpoint, why))
    if derived and saved_derived is None:
        warnings.append(
            f"checkpoint {checkpoint} records no derived values ({', '.join(derived)}); their "
            "changes cannot be checked"
        )
    elif derived:
        named = {issue.path for issue in refused}
        for name, old, new in changed_keys(saved_derived, derived):
            if name not in named:  # the key itself changed: refused once, by its name
                why = DERIVED_REFUSED.get(name, _PROMPTS)
                refused.append(_refusal(f"derived.{name}", old, new, checkpoint, why))
    if refused:
        raise ConfigError(refused)
    return warnings


def check_resume_step(step: int, max_steps: int, checkpoint: Path) -> str:
    """A resume whose checkpoint is past `max_steps`: a ``ConfigError`` naming both (nothing
    can be trained, and the checkpoint's policy is not the one `max_steps` asks for). At
    `max_steps` exactly (a finished run resumed, e.g. the same command again, which keeps its
    result: the final policy is evaluated again): the line that says so; else ''."""
    if step > max_steps:
        raise ConfigError(
            ConfigIssue(
                "max_steps",
                f"is {max_steps}, but checkpoint {checkpoint} is at step {step}: nothing is "
                f"left to train; raise max_steps above {step} to train on from it (or resume "
                "from an earlier checkpoint, or start fresh)",
            )
        )
    if step == max_steps:
        return (
            f"checkpoint {checkpoint} is at max_steps={max_steps}: the run is finished and "
            f"nothing is trained (raise max_steps above {step} to train on)"
        )
    return ""
