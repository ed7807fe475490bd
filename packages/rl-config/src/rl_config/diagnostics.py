"""Turn pydantic validation errors into one ConfigError with full paths and suggestions."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

from rl_config.errors import ConfigError, ConfigIssue
from rl_config.schema_walk import describe_type, join_path, key_index, locate, yaml_fields

_TYPE_ERRORS = {
    "int_parsing",
    "int_type",
    "int_from_float",
    "float_parsing",
    "float_type",
    "bool_parsing",
    "bool_type",
    "string_type",
    "dict_type",
    "list_type",
    "model_type",
    "model_attributes_type",
    "none_required",
    "tuple_type",
    "union_tag_invalid",
    "is_instance_of",
}


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def suggest_key(root: type[BaseModel], model: type[BaseModel] | None, path: str, key: str) -> str:
    """'did you mean ...' for an unknown key at ``path`` (empty when nothing is close). verl keys
    never get here: they are refused before validation (rl_config.verl_keys)."""
    if not path and key.endswith("_app"):
        return app_section_hint(key)
    if model is not None:
        names = list(yaml_fields(model))
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
        if close:
            return f"did you mean '{close[0]}'?"
    roll = _roll_key_suggestion(path, key)
    if roll:
        return roll
    elsewhere = key_index(root).get(key)
    if elsewhere:
        return f"'{key}' is valid at: {', '.join(elsewhere[:3])}"
    if model is not None:
        close = difflib.get_close_matches(key, list(key_index(root)), n=1, cutoff=0.75)
        if close:
            return (
                f"did you mean '{close[0]}' (valid at: {', '.join(key_index(root)[close[0]][:3])})?"
            )
    return ""


def app_section_hint(section: str) -> str:
    """What to do about an app's own top-level section (``agentic_app:``) in a file checked as
    a plain experiment: it belongs to the app, which reads it."""
    app = section.removesuffix("_app")
    return (
        f"'{section}' is the options section of apps/{app}, which rl-config does not read: check "
        f"the file with `rl-config check FILE --app-section {section}` or "
        f"`uv run apps/{app} --config FILE --dry-run`"
    )


def _roll_key_suggestion(path: str, key: str) -> str:
    """'did you mean' among the ROLL keys accepted at ``path`` (rl_config.roll_compat)."""
    from rl_config.roll_compat import ROLL_IGNORED, ROLL_NOT_SUPPORTED
    from rl_config.roll_keys import matches

    leaves = []
    for pattern in (*ROLL_IGNORED, *ROLL_NOT_SUPPORTED):
        parent, _, leaf = pattern.rpartition(".")
        if "*" not in leaf and (matches(parent, path) if parent else not path):
            leaves.append(leaf)
    close = difflib.get_close_matches(key, leaves, n=1, cutoff=0.8)
    return f"did you mean '{close[0]}' (a ROLL key, accepted and ignored)?" if close else ""


def _issue_for(root: type[BaseModel], err: Any) -> list[ConfigIssue]:
    kind = err["type"]
    loc = tuple(err["loc"])
    if kind == "value_error":
        inner = (err.get("ctx") or {}).get("error")
        nested = getattr(inner, "issues", None)
        if isinstance(nested, list):
            return list(nested)
    if kind == "extra_forbidden":
        where = locate(root, loc[:-1])
        key = str(loc[-1])
        path = join_path(where.path, key)
        hint = suggest_key(root, where.model, where.path, key)
        return [ConfigIssue(path, "unknown key" + (f"; {hint}" if hint else ""))]
    where = locate(root, loc)
    path = where.path
    value = err.get("input")
    if kind == "missing":
        return [
            ConfigIssue(
                path, f"required key is missing (expected {describe_type(where.annotation)})"
            )
        ]
    if kind in ("literal_error", "enum"):
        expected = err.get("ctx", {}).get("expected", describe_type(where.annotation))
        msg = f"{value!r} is not allowed; expected {expected}"
        options = [str(a) for a in getattr(where.annotation, "__args__", ())]
        close = difflib.get_close_matches(str(value), options, n=1) if options else []
        if close:
            msg += f"; did you mean '{close[0]}'?"
        return [ConfigIssue(path, msg)]
    if kind in _TYPE_ERRORS or not where.complete:
        return [
            ConfigIssue(path, f"expected {describe_type(where.annotation)}, got {_show(value)}")
        ]
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    elif msg.startswith("Input should be "):
        msg = "must be " + msg[len("Input should be ") :]
    return [ConfigIssue(path, f"{msg} (got {_show(value)})")]


def config_error_from_validation(exc: ValidationError, root: type[BaseModel]) -> ConfigError:
    """One ConfigError holding every error of ``exc`` (deduplicated per path)."""
    issues: list[ConfigIssue] = []
    typed_paths: set[str] = set()
    for err in exc.errors(include_url=False):
        for issue in _issue_for(root, err):
            if issue in issues:
                continue
            if issue.message.startswith("expected "):
                # a union yields one error per member; report the field once
                if issue.path in typed_paths:
                    continue
                typed_paths.add(issue.path)
            issues.append(issue)
    return ConfigError(issues)
