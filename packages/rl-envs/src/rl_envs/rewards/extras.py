"""The metrics a reward function returns besides its score (verl's ``reward_extra_info``).

Offers: ``numeric_extras(extra) -> RewardExtras``, ``EXTRA_SKIP_REASONS`` (reason: what it
means): the entries of a reward dict other than
``score`` that can be logged as metrics, and why the others were not; ``ExtraNames``: the
names one consumer (a run's scorer) logs, at most ``MAX_EXTRA_NAMES`` distinct ones. The dict comes from
untrusted code (it crossed the sandbox as JSON, bounded by the sandbox's output limit), so the
check is strict and never raises:

* an entry whose value is a finite int, float or bool is kept, as a float;
* an entry whose value is anything else is skipped: ``not_number`` (text, lists, None, dicts ...)
  or ``not_finite`` (NaN, inf);
* an entry whose name is not a metric name is skipped: ``bad_name`` (names are refused, not
  rewritten, so two names never collide: ``NAME_PATTERN``, at most ``MAX_NAME_CHARS`` characters,
  letters, digits, ``_ . -``, no ``/``);
* a dict with more than ``MAX_EXTRAS`` entries, or one that is not a dict of named entries, is
  dropped whole: ``too_many`` / ``malformed`` (the call's score is kept either way);
* ``ExtraNames.admit``: a name past the first ``MAX_EXTRA_NAMES`` distinct names its consumer
  met is skipped: ``new_name`` (each call may return up to ``MAX_EXTRAS`` names, and a reward
  that makes up new ones on every call would otherwise add metrics to every step's row for
  ever).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

MAX_EXTRAS = 32
MAX_EXTRA_NAMES = 2 * MAX_EXTRAS
MAX_NAME_CHARS = 64
NAME_PATTERN = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.\-]{{0,{MAX_NAME_CHARS - 1}}}")
EXTRA_SKIP_REASONS = {
    "not_number": "a value that is not an int, float or bool (text, a list, None ...)",
    "not_finite": "a value that is NaN or infinite",
    "bad_name": f"a name that is not {MAX_NAME_CHARS} characters or fewer of letters, digits, "
    "'_', '.', '-' (no '/')",
    "too_many": f"a dict of more than {MAX_EXTRAS} extras (all of its extras dropped)",
    "malformed": "extras that are not a dict of named entries (all dropped)",
    "new_name": f"a name past the first {MAX_EXTRA_NAMES} distinct names of the run",
}


@dataclass(frozen=True)
class RewardExtras:
    """``values``: the loggable extras by name; ``skipped``: entries left out, by reason
    (``not_number``, ``not_finite``, ``bad_name``, or the whole dict's ``too_many`` /
    ``malformed``, counted once per call)."""

    values: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)


def numeric_extras(extra: Any) -> RewardExtras:
    """The loggable entries of ``extra`` (a reward's dict without ``score``; see module doc)."""
    if not isinstance(extra, dict):
        return RewardExtras(skipped={"malformed": 1})
    if len(extra) > MAX_EXTRAS:
        return RewardExtras(skipped={"too_many": 1})
    values: dict[str, float] = {}
    skipped: dict[str, int] = {}
    for name, value in extra.items():
        reason = _refusal(name, value)
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
        else:
            values[name] = float(value)
    return RewardExtras(values, skipped)


class ExtraNames:
    """The extra names one consumer logs: the first ``limit`` distinct names it admits; later new
    names are skipped as ``new_name``. Not thread-safe (the caller holds its lock)."""

    def __init__(self, limit: int = MAX_EXTRA_NAMES) -> None:
        self.limit = limit
        self.names: set[str] = set()

    def admit(self, extras: RewardExtras) -> RewardExtras:
        """``extras`` without the names past the limit, which are counted as ``new_name``."""
        values: dict[str, float] = {}
        refused = 0
        for name, value in extras.values.items():
            if name not in self.names and len(self.names) >= self.limit:
                refused += 1
                continue
            self.names.add(name)
            values[name] = value
        if not refused:
            return extras
        return RewardExtras(values, {**extras.skipped, "new_name": refused})


def _refusal(name: Any, value: Any) -> str:
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None:
        return "bad_name"
    if not isinstance(value, bool | int | float):
        return "not_number"
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        return "not_finite"
    return "" if math.isfinite(number) else "not_finite"
