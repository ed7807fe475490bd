"""The gain of training on success rates, with its standard error (summary.json's `gain *`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rl_runtime.track.gains import proportion_gain


def success_gains(
    before: dict[str, float],
    after: dict[str, float],
    keys: Sequence[str],
    n: int,
    distinct: int = 0,
) -> dict[str, Any]:
    """`gain <key>` for each of `keys` both evaluations have, at n episodes. With `distinct` > 0
    (the number of distinct validation envs) each also gets `gain_in_se_at_distinct`: envs drawn
    twice are not independent, so the standard error at the distinct count is the cautious one."""
    if not n:
        return {}
    out: dict[str, Any] = {
        f"gain {key}": proportion_gain(before[key], after[key], n)
        for key in keys
        if key in before and key in after
    }
    if out and distinct:
        out["validation maps"] = {"episodes": n, "distinct": distinct}
        for key in keys:
            if f"gain {key}" in out:
                at = proportion_gain(before[key], after[key], distinct)
                out[f"gain {key}"]["gain_in_se_at_distinct"] = at["gain_in_se"]
    return out
