"""Registry of env types (factories) and tags (an env type plus a config), both by name.

``make_env("SimpleSokoban", max_steps=20)`` looks up the tag, merges the overrides into its config
and calls the factory of its env type; ``make_env("sokoban", dim_room=(7, 7))`` calls the factory
directly. Duplicate names are an error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rl_envs.base import Env

EnvFactory = Callable[..., Env]

_ENV_TYPES: dict[str, EnvFactory] = {}
_TAGS: dict[str, EnvTag] = {}


@dataclass(frozen=True)
class EnvTag:
    """A named configuration of an env type (ROLL's ``custom_envs`` entry)."""

    name: str
    env_type: str
    env_config: Mapping[str, Any] = field(default_factory=dict)
    max_tokens_per_step: int | None = None


def register_env(name: str, factory: EnvFactory | None = None) -> Any:
    """Register an env factory under ``name``; usable as ``@register_env("name")``. A name the
    built-ins use is refused whether or not they have been loaded yet."""

    def _register(fn: EnvFactory) -> EnvFactory:
        _ensure_builtins()
        if name in _ENV_TYPES or name in _TAGS:
            raise ValueError(f"env name {name!r} is already registered")
        _ENV_TYPES[name] = fn
        return fn

    return _register(factory) if factory is not None else _register


def register_tag(
    name: str,
    env_type: str,
    env_config: Mapping[str, Any] | None = None,
    *,
    max_tokens_per_step: int | None = None,
) -> EnvTag:
    """Register a tag: an env type with a fixed config. Duplicate or clashing names (built-ins
    included, loaded or not) are errors."""
    _ensure_builtins()
    if name in _TAGS or name in _ENV_TYPES:
        raise ValueError(f"env tag {name!r} is already registered")
    tag = EnvTag(name, env_type, dict(env_config or {}), max_tokens_per_step)
    _TAGS[name] = tag
    return tag


def _ensure_builtins() -> None:
    # registers the built-in envs and tags; while rl_envs.builtin itself runs (its register_*
    # calls come here), the import finds it in sys.modules and returns at once
    import rl_envs.builtin  # noqa: F401


def get_tag(name: str) -> EnvTag:
    _ensure_builtins()
    if name not in _TAGS:
        raise KeyError(f"unknown env tag {name!r}; known tags: {sorted(_TAGS)}")
    return _TAGS[name]


def list_env_types() -> list[str]:
    _ensure_builtins()
    return sorted(_ENV_TYPES)


def list_tags() -> list[str]:
    _ensure_builtins()
    return sorted(_TAGS)


def resolve_config(tag_or_type: str, **config: Any) -> tuple[str, dict[str, Any]]:
    """Return ``(env_type, merged_config)`` for a tag or env type name."""
    _ensure_builtins()
    if tag_or_type in _TAGS:
        tag = _TAGS[tag_or_type]
        return tag.env_type, {**tag.env_config, **config}
    if tag_or_type in _ENV_TYPES:
        return tag_or_type, dict(config)
    raise KeyError(
        f"unknown env {tag_or_type!r}; tags: {sorted(_TAGS)}, env types: {sorted(_ENV_TYPES)}"
    )


def prompt_options(tag_or_type: str) -> tuple[str, ...]:
    """The constructor options of a tag's or env type's factory that set its prompts
    (``system_prompt``: the system message, ``turn_template``: each turn's user message, see
    rl_envs.prompts); a factory declares them in a ``prompt_options`` attribute, none if it has
    none. An unknown name raises ``KeyError`` listing the known ones."""
    env_type, _ = resolve_config(tag_or_type)
    if env_type not in _ENV_TYPES:
        raise KeyError(f"tag {tag_or_type!r} names unknown env type {env_type!r}")
    return tuple(getattr(_ENV_TYPES[env_type], "prompt_options", ()))


def env_options(tag_or_type: str) -> tuple[str, ...]:
    """The keyword options an env type's factory takes (for a class, its ``__init__`` and those
    of its bases it passes ``**kwargs`` on to), sorted; for error messages and suggestions. An
    unknown name raises ``KeyError``."""
    import inspect

    env_type, _ = resolve_config(tag_or_type)
    if env_type not in _ENV_TYPES:
        raise KeyError(f"tag {tag_or_type!r} names unknown env type {env_type!r}")
    factory = _ENV_TYPES[env_type]
    callables = [c.__init__ for c in factory.__mro__] if isinstance(factory, type) else [factory]
    names: set[str] = set()
    for fn in callables:
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            continue
        names |= {p.name for p in params if p.name != "self" and p.kind in (
            p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}  # fmt: skip
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return tuple(sorted(names))


def make_env(tag_or_type: str, **config: Any) -> Env:
    """Build an env from a tag (``SimpleSokoban``) or an env type (``sokoban``) plus overrides."""
    env_type, merged = resolve_config(tag_or_type, **config)
    if env_type not in _ENV_TYPES:
        raise KeyError(f"tag {tag_or_type!r} names unknown env type {env_type!r}")
    return _ENV_TYPES[env_type](**merged)
