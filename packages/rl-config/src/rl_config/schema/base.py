"""Base model of every config section: unknown keys are errors, docs live in the fields."""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

_NUMBERS = (int, float)


def _members(annotation: Any) -> tuple[Any, ...]:
    """The types a (possibly ``Annotated``, union) annotation admits, unions flattened."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return tuple(m for arg in get_args(annotation) for m in _members(arg))
    return (annotation,)


def _bool_for_number(annotation: Any, value: Any) -> bool:
    """True when ``value`` is, or holds (list items, mapping values), a bool where
    ``annotation`` wants an int or a float and no bool (pydantic's lax mode reads ``true`` as
    1 there)."""
    members = _members(annotation)
    if isinstance(value, bool):
        return bool(set(members) & set(_NUMBERS)) and not (set(members) & {bool, Any, object})
    if isinstance(value, list | tuple):
        items = [get_args(m)[0] for m in members if get_origin(m) in (list, tuple) and get_args(m)]
        return any(_bool_for_number(item, v) for item in items for v in value)
    if isinstance(value, dict):
        values = [get_args(m)[1] for m in members if get_origin(m) is dict and get_args(m)]
        return any(_bool_for_number(item, v) for item in values for v in value.values())
    return False


class StrictModel(BaseModel):
    """A config section. ``extra="forbid"``: a key the schema does not know is an error;
    ``allow_inf_nan=False``: a float key that is inf or NaN is an error; a bool where a number
    is expected (``max_steps: true``) is an error (``_no_bool_for_number``)."""

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        validate_default=False,
        arbitrary_types_allowed=False,
        allow_inf_nan=False,  # `beta: .inf` / `beta=inf` is an error naming the key, not a NaN loss
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, value: Any, info: ValidationInfo) -> Any:
        """Every int/float field (and list/dict of them) refuses a bool: pydantic's lax mode
        would read ``max_steps=true`` as 1 and ``beta: false`` as 0.0."""
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and _bool_for_number(field.annotation, value):
            from rl_config.schema_walk import describe_type

            raise ValueError(f"expected {describe_type(field.annotation)}, not a bool")
        return value
