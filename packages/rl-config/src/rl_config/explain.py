"""Field documentation by dotted key: what ``rl-config explain KEY`` prints."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import PydanticUndefined

from rl_config.diagnostics import suggest_key
from rl_config.errors import ConfigError, ConfigIssue
from rl_config.schema_walk import (
    constraints_of,
    default_of,
    field_by_key,
    is_model,
    join_path,
    short_type,
    unwrap,
    yaml_fields,
)
from rl_config.verl_keys import verl_key_hint


@dataclass
class FieldDoc:
    """Documentation of one schema key."""

    path: str
    type: str
    default: Any
    description: str
    constraints: str = ""
    children: list[str] = field(default_factory=list)

    def render(self) -> str:
        default = "(required)" if self.default is PydanticUndefined else _show(self.default)
        lines = [self.path or "(top level)", f"  type:        {self.type}"]
        if self.constraints:
            lines.append(f"  constraints: {self.constraints}")
        lines.append(f"  default:     {default}")
        lines.append(f"  {self.description}")
        if self.children:
            lines.append("  keys:")
            lines += [f"    {c}" for c in self.children]
        return "\n".join(lines)


def _show(value: Any) -> str:
    try:
        text = json.dumps(value)
    except TypeError:
        text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _children(model: type[BaseModel]) -> list[str]:
    out = []
    for key, info in yaml_fields(model).items():
        desc = (info.description or "").split(". ")[0].rstrip(".")
        out.append(f"{key:<34} {desc}")
    return out


def explain(key: str, root: type[BaseModel] | None = None) -> FieldDoc:
    """Documentation of ``key`` (e.g. ``actor_train.training_args.learning_rate``;
    ``custom_envs.<any name>.env_type`` and list indexes are accepted). Raises ConfigError with
    a suggestion for unknown keys."""
    if root is None:
        from rl_config.schema import ExperimentConfig

        root = ExperimentConfig
    parts = [p for p in key.replace("[", ".").replace("]", "").split(".") if p]
    if not parts:
        return FieldDoc(
            "", root.__name__, PydanticUndefined, root.__doc__ or "", "", _children(root)
        )
    current: Any = root
    path = ""
    info = None
    for i, part in enumerate(parts):
        inner = unwrap(current)
        origin = get_origin(inner)
        if is_model(inner):
            found = field_by_key(inner, part)
            if found is None:
                verl = verl_key_hint(key)
                if verl:
                    raise ConfigError(ConfigIssue(key, f"unknown key; {verl}"))
                hint = suggest_key(root, inner, path, part)
                raise ConfigError(
                    ConfigIssue(
                        join_path(path, part), "unknown key" + (f"; {hint}" if hint else "")
                    )
                )
            name, info = found
            path = join_path(path, name)
            current = info.annotation
        elif origin is dict and i < len(parts):
            args = get_args(inner)
            path = join_path(path, part)
            current = args[1] if len(args) == 2 else Any
            info = None
        elif origin is list and part.isdigit():
            args = get_args(inner)
            path = join_path(path, int(part))
            current = args[0] if args else Any
            info = None
        else:
            raise ConfigError(
                ConfigIssue(
                    join_path(path, part), f"{path} is a free-form value; no schema below it"
                )
            )
    inner = unwrap(current)
    children = _children(inner) if is_model(inner) else []
    if info is None:
        doc = (inner.__doc__ or "") if is_model(inner) else ""
        return FieldDoc(path, short_type(current), PydanticUndefined, doc.strip(), "", children)
    return FieldDoc(
        path,
        short_type(info.annotation),
        default_of(info),
        info.description or "",
        constraints_of(info),
        children,
    )
