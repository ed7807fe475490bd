"""summary.json as standard JSON: what a run reports at its end, readable by any JSON parser.

Python's `json` writes a non-finite float as `NaN` / `Infinity`, which JSON does not have (jq,
JavaScript and strict parsers refuse the file). A figure that is not a finite number (a NaN
evaluation metric, `gain_in_se` of a gain with a standard error of 0) is written as `null`.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from rl_config.atomic_write import write_text_atomically


def finite_or_null(value: Any) -> Any:
    """`value` with every non-finite float inside it (dicts, lists, tuples) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(v) for v in value]
    return value


def write_summary(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    """Write `data` to `path` as indented standard JSON (non-finite floats as null; other
    values JSON does not know as their str), atomically (rl_config.atomic_write: a fresh
    temporary file, then a rename; nothing planted in the directory is written through)."""
    text = json.dumps(finite_or_null(data), indent=2, default=str, allow_nan=False)
    write_text_atomically(path, text)
