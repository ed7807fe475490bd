"""What the apps' own option sections (`agentic_app:`, `rlvr_app:`, `dpo_app:`) share: a strict
builder from the YAML mapping and the locally built tiny model's shape."""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class TinyModelOptions:
    """The shape of `rl_rollout.tiny_model.build_tiny_model` when an app builds one."""

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    intermediate_size: int = 256
    seed: int = 0


def strict_options(cls: type[T], raw: dict[str, Any] | None, path: str) -> T:
    """The dataclass `cls` from the mapping `raw`; an unknown key is an error naming `path` and
    the known keys. A field whose default is a dataclass (`field(default_factory=Sub)`) is built
    from its sub-mapping the same way, as `path.field`."""
    raw = dict(raw or {})
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; known: {sorted(known)}")
    for name, value in raw.items():
        sub = known[name].default_factory
        if isinstance(sub, type) and is_dataclass(sub) and not is_dataclass(value):
            raw[name] = strict_options(sub, value, f"{path}.{name}")
    return cls(**raw)
