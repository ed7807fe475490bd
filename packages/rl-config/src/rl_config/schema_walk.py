"""Walking the schema by key path: field lookup, type descriptions, key indexes.

Used to turn validation errors into messages with full dotted paths and suggestions, and by
``rl-config explain``.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Literal, TypeGuard, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo, PydanticUndefined

NoneType = type(None)


def unwrap(annotation: Any) -> Any:
    """Strip ``Annotated`` and ``X | None`` (nullable) wrappers."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
            continue
        if origin in (Union, types.UnionType):
            args = [a for a in get_args(annotation) if a is not NoneType]
            if len(args) == 1:
                annotation = args[0]
                continue
        return annotation


def is_model(annotation: Any) -> TypeGuard[type[BaseModel]]:
    """True for a pydantic model class."""
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def yaml_fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """The model's fields by their YAML key (alias when set)."""
    return {(info.alias or name): info for name, info in model.model_fields.items()}


def field_by_key(model: type[BaseModel], key: str) -> tuple[str, FieldInfo] | None:
    """Find a field by YAML key or Python name; returns (yaml_key, info)."""
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return (info.alias or name), info
    return None


def describe_type(annotation: Any) -> str:
    """Readable description of an annotation: 'an integer', "one of 'a', 'b'", ..."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return describe_type(get_args(annotation)[0])
    if annotation is Any:
        return "any value"
    if annotation is NoneType or annotation is None:
        return "null"
    if annotation is bool:
        return "true or false"
    if annotation is int:
        return "an integer"
    if annotation is float:
        return "a number"
    if annotation is str:
        return "a string"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " or ".join(describe_type(a) for a in get_args(annotation))
    if origin in (list, tuple):
        args = get_args(annotation)
        return f"a list of {describe_type(args[0]) if args else 'values'}"
    if origin is dict or annotation is dict:
        args = get_args(annotation)
        inner = describe_type(args[1]) if len(args) == 2 else "values"
        return f"a mapping of names to {inner}"
    if is_model(annotation):
        return f"a mapping ({annotation.__name__} section)"
    return getattr(annotation, "__name__", str(annotation))


def short_type(annotation: Any) -> str:
    """Compact Python-like spelling of an annotation for docs: ``int | None``."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return short_type(get_args(annotation)[0])
    if annotation is NoneType:
        return "None"
    if origin is Literal:
        return "Literal[" + ", ".join(repr(a) for a in get_args(annotation)) + "]"
    if origin in (Union, types.UnionType):
        return " | ".join(short_type(a) for a in get_args(annotation))
    if origin is not None:
        args = ", ".join(short_type(a) for a in get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(annotation, "__name__", str(annotation))


@dataclass
class Located:
    """Result of walking an error location through the schema."""

    path: str  # dotted YAML path of the deepest schema element reached
    annotation: Any  # annotation at that element (unwrapped of nullability)
    model: type[BaseModel] | None  # the model at that element, if it is a model
    complete: bool  # False when the walk stopped early (inside a union or free-form value)


def join_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def locate(root: type[BaseModel], loc: tuple[str | int, ...]) -> Located:
    """Walk ``loc`` (a pydantic error location) from ``root``."""
    path = ""
    annotation: Any = root
    for i, part in enumerate(loc):
        current = unwrap(annotation)
        origin = get_origin(current)
        if is_model(current):
            found = field_by_key(current, str(part))
            if found is None:
                return Located(path, current, current, False)
            key, info = found
            path = join_path(path, key)
            annotation = info.annotation
        elif origin is dict or current is dict:
            path = join_path(path, part)
            args = get_args(current)
            annotation = args[1] if len(args) == 2 else Any
        elif origin in (list, tuple) and isinstance(part, int):
            path = join_path(path, part)
            args = get_args(current)
            annotation = args[0] if args else Any
        else:
            # a union tag ('int', 'str', 'function-after[...]') or a free-form value
            final = unwrap(annotation)
            return Located(path, final, final if is_model(final) else None, i == len(loc))
    final = unwrap(annotation)
    return Located(path, final, final if is_model(final) else None, True)


@lru_cache(maxsize=8)
def key_index(root: type[BaseModel]) -> dict[str, list[str]]:
    """Every schema key name -> the dotted paths where it is valid (``<name>`` for dict keys)."""
    index: dict[str, list[str]] = {}

    def visit(model: type[BaseModel], prefix: str, seen: tuple[type, ...]) -> None:
        if model in seen:
            return
        for key, info in yaml_fields(model).items():
            path = join_path(prefix, key)
            index.setdefault(key, []).append(path)
            inner = unwrap(info.annotation)
            if is_model(inner):
                visit(inner, path, (*seen, model))
            elif get_origin(inner) is dict:
                args = get_args(inner)
                value = unwrap(args[1]) if len(args) == 2 else None
                if is_model(value):
                    visit(value, f"{path}.<name>", (*seen, model))
            elif get_origin(inner) is list:
                args = get_args(inner)
                value = unwrap(args[0]) if args else None
                if is_model(value):
                    visit(value, f"{path}[<i>]", (*seen, model))

    visit(root, "", ())
    return index


def default_of(info: FieldInfo) -> Any:
    """The field's default value (calling a default factory), or ``PydanticUndefined``."""
    if info.default_factory is not None:
        factory: Any = info.default_factory
        try:
            value = factory()
        except TypeError:
            return PydanticUndefined
        return (
            value.model_dump(mode="json", by_alias=True) if isinstance(value, BaseModel) else value
        )
    return info.default


def constraints_of(info: FieldInfo) -> str:
    """Numeric/length constraints of a field, e.g. '>= 1'."""
    parts: list[str] = []
    symbols = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "min_length": "min length"}
    for meta in info.metadata:
        for attr, sym in symbols.items():
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sym} {value}")
    return ", ".join(parts)
