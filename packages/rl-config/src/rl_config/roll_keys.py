"""Apply the ROLL compatibility tables (``rl_config.roll_compat``) to a raw config mapping.

``strip_roll_keys`` removes accepted-but-unimplemented keys (returning one note per key), renames
aliased strategy names and turns ROLL's ``None`` strings into null; ``megatron_issue`` gives the
single error of a config that uses a Megatron strategy.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from fnmatch import fnmatchcase
from typing import Any

from rl_config.errors import ConfigIssue
from rl_config.roll_compat import (
    DPO_KEYS,
    KEY_ALIASES,
    MEGATRON_STRATEGIES,
    NONE_STRINGS,
    ROLES,
    ROLL_IGNORED,
    ROLL_NOT_SUPPORTED,
    ROLL_PIPELINES_NOT_IMPLEMENTED,
    ROLL_UNSUPPORTED_VALUES,
    SFT_KEYS,
    SFT_ROLE,
    STRATEGY_ALIASES,
    VALUE_ALIASES,
)

CONVERT_HINT = "rl-config convert {file} --strategy fsdp2|deepspeed -o OUT"


def pipeline_kind(data: dict[str, Any]) -> str:
    """agentic (has train_env_manager), dpo (has a DPO key), sft (has an SFT key or an
    `sft_train` section) or rlvr."""
    if data.get("train_env_manager") is not None:
        return "agentic"
    if any(key in data for key in DPO_KEYS):
        return "dpo"
    if any(key in data for key in (*SFT_KEYS, SFT_ROLE)):
        return "sft"
    return "rlvr"


def sft_role_issue(data: dict[str, Any]) -> ConfigIssue | None:
    """The error of a config with both ROLL's `sft_train` and `actor_train` (the same role)."""
    if SFT_ROLE in data and "actor_train" in data:
        return ConfigIssue(
            SFT_ROLE,
            "sft_train and actor_train are both set: ROLL's SFT section is this stack's "
            "actor_train; keep one of them",
        )
    return None


def rename_sft_role(data: dict[str, Any]) -> tuple[dict[str, Any], list[ConfigIssue]]:
    """ROLL's SFT section `sft_train` as `actor_train` (the policy being trained), with a note
    (a config with both: `sft_role_issue`, unchanged here). The config stays marked SFT:
    `response_key` is written with its default when no SFT key is set (`pipeline_kind`)."""
    if SFT_ROLE not in data or "actor_train" in data:
        return data, []
    out = {("actor_train" if k == SFT_ROLE else k): v for k, v in data.items()}
    if not any(key in out for key in SFT_KEYS):
        out["response_key"] = "output"
    note = ConfigIssue(SFT_ROLE, "ROLL's SFT training section; read as actor_train")
    return out, [note]


def unsupported_values(data: dict[str, Any]) -> list[ConfigIssue]:
    """Errors for ROLL values this stack refuses (``adv_estimator: agentic_reinforce``)."""
    issues: list[ConfigIssue] = []
    for key, values in ROLL_UNSUPPORTED_VALUES.items():
        value = data.get(key)
        if isinstance(value, str) and value in values:
            issues.append(ConfigIssue(key, f"'{value}' is not supported: {values[value]}"))
    return issues


def matches(pattern: str, path: str) -> bool:
    """Whether dotted ``path`` matches ``pattern`` (segment-wise; ``ROLE`` = a worker role)."""
    want = pattern.split(".")
    got = path.split(".")
    if len(want) != len(got):
        return False
    for w, g in zip(want, got):
        if w == "ROLE":
            if g not in ROLES:
                return False
        elif not fnmatchcase(g, w):
            return False
    return True


def lookup(table: dict[str, str], path: str) -> str | None:
    """The reason ``table`` gives for ``path``, or None."""
    for pattern, reason in table.items():
        if matches(pattern, path):
            return reason
    return None


def _unset(value: Any) -> bool:
    return value is None or value is False or value == {} or value == [] or value == ""


def _walk(node: dict[str, Any], prefix: str) -> Iterator[tuple[dict[str, Any], str, str]]:
    """(parent mapping, key, dotted path) of every mapping entry, parents before children."""
    for key in list(node):
        path = f"{prefix}.{key}" if prefix else str(key)
        yield node, key, path
        value = node.get(key)
        if isinstance(value, dict):
            yield from _walk(value, path)


def strip_roll_keys(data: dict[str, Any]) -> tuple[dict[str, Any], list[ConfigIssue]]:
    """A copy of ``data`` without the keys of the compatibility tables, and a note per key.

    Notes of unimplemented ROLL fields whose value is unset (null, false, empty) are skipped: the
    feature is off either way.
    """
    out = copy.deepcopy(data)
    notes: list[ConfigIssue] = []
    removed: set[str] = set()
    for parent, key, path in list(_walk(out, "")):
        if any(path.startswith(r + ".") for r in removed) or key not in parent:
            continue
        value = parent[key]
        reason = lookup(ROLL_IGNORED, path)
        if reason is not None:
            notes.append(ConfigIssue(path, f"ignored, as ROLL ignores it ({reason})"))
        else:
            reason = lookup(ROLL_NOT_SUPPORTED, path)
            if reason is None:
                _normalise(parent, key, path, notes)
                continue
            if not _unset(value):
                notes.append(ConfigIssue(path, f"not supported, value ignored: {reason}"))
        del parent[key]
        removed.add(path)
    return out, notes


def _normalise(parent: dict[str, Any], key: str, path: str, notes: list[ConfigIssue]) -> None:
    value = parent[key]
    for pattern, new in KEY_ALIASES.items():
        if matches(pattern, path) and new not in parent:
            parent[new] = parent.pop(key)
            notes.append(ConfigIssue(path, f"ROLL's name of {new}; read as {new}"))
            return
    for pattern, spellings in VALUE_ALIASES.items():
        if matches(pattern, path) and isinstance(value, str) and value in spellings:
            parent[key] = spellings[value]
            return
    if path in NONE_STRINGS and isinstance(value, str) and value.lower() == "none":
        parent[key] = None
        return
    aliases = STRATEGY_ALIASES.get(path)
    if aliases and isinstance(value, str) and value in aliases:
        parent[key] = aliases[value]
        notes.append(
            ConfigIssue(
                path, f"'{value}' runs as '{aliases[value]}' here (forward only, same result)"
            )
        )


def megatron_roles(data: dict[str, Any]) -> dict[str, str]:
    """Role -> Megatron strategy name, for every role section using one."""
    found: dict[str, str] = {}
    for role, section in data.items():
        if not isinstance(section, dict):
            continue
        strategy = section.get("strategy_args")
        name = strategy.get("strategy_name") if isinstance(strategy, dict) else None
        if isinstance(name, str) and name in MEGATRON_STRATEGIES:
            found[str(role)] = name
    return found


def megatron_keys(data: dict[str, Any]) -> list[str]:
    """Dotted paths of the Megatron-only keys of ``data`` (strategy names and their options)."""
    keys: list[str] = []
    for role, name in megatron_roles(data).items():
        keys.append(f"{role}.strategy_args.strategy_name={name}")
        options = data[role]["strategy_args"].get("strategy_config")
        if isinstance(options, dict):
            keys.extend(f"{role}.strategy_args.strategy_config.{k}" for k in options)
    return keys


def missing_pipeline_issue(data: dict[str, Any]) -> ConfigIssue | None:
    """The one error of a config of a ROLL pipeline this stack does not have (distillation,
    SFT: ``ROLL_PIPELINES_NOT_IMPLEMENTED``); None for any other config."""
    from rl_config.convert_ofd import is_offline_distill, is_vision_language
    from rl_config.convert_opd import is_opd

    if is_offline_distill(data) and not is_vision_language(data):
        return ConfigIssue(
            "student",
            "this is a config of ROLL's offline distillation pipeline (student, teacher, "
            "kd_objective ...); apps/distill runs it (token-level KL on the teacher's logits) "
            "once rewritten in its form: "
            + CONVERT_HINT.format(file="FILE")
            + ", then uv run apps/distill --config OUT",
        )
    if is_opd(data):
        return ConfigIssue(
            "teacher",
            "this is a config of ROLL's on-policy distillation (student_train, student_infer, "
            "teacher); apps/distill runs it once rewritten in its form: "
            + CONVERT_HINT.format(file="FILE")
            + ", then uv run apps/distill --config OUT",
        )
    for pipeline, markers in ROLL_PIPELINES_NOT_IMPLEMENTED.items():
        found = [key for key in markers if key in data]
        if found:
            return ConfigIssue(
                found[0],
                f"this is a config of ROLL's {pipeline} pipeline ({', '.join(found)}), which is "
                "not implemented in this stack; its pipelines are agentic (apps/agentic), RLVR "
                "(apps/rlvr, apps/async), DPO (apps/dpo) and on-policy distillation "
                "(apps/distill: ROLL's student_train/student_infer/teacher configs after "
                "rl-config convert) and text distillation on the teacher's logits (apps/distill, "
                "ROLL's student/teacher configs after rl-config convert)",
            )
    return None


def pipeline_or_megatron_issue(
    data: dict[str, Any], source: str | None = None
) -> ConfigIssue | None:
    """The one error that refuses the whole config before its keys are judged: a pipeline this
    stack lacks, else Megatron (None when neither)."""
    return missing_pipeline_issue(data) or megatron_issue(data, source)


def megatron_issue(data: dict[str, Any], source: str | None = None) -> ConfigIssue | None:
    """The one error of a Megatron config (None when no role uses a Megatron strategy)."""
    keys = megatron_keys(data)
    if not keys:
        return None
    first = next(iter(megatron_roles(data)))
    return ConfigIssue(
        f"{first}.strategy_args.strategy_name",
        "Megatron-LM is not implemented in this stack; Megatron-only keys: "
        f"{'; '.join(keys)}. Convert the file to FSDP2 or DeepSpeed with: "
        + CONVERT_HINT.format(file=source or "FILE"),
    )
