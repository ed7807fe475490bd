"""Base model of every config section: unknown keys are errors, docs live in the fields."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A config section. ``extra="forbid"``: a key the schema does not know is an error;
    ``allow_inf_nan=False``: a float key that is inf or NaN is an error."""

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        validate_default=False,
        arbitrary_types_allowed=False,
        allow_inf_nan=False,  # `beta: .inf` / `beta=inf` is an error naming the key, not a NaN loss
    )
