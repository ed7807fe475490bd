"""The gain of training on success rates, with its standard error (summary.json's `gain *`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def proportion_gain(before: float, after: float, n: int) -> dict[str, float]:
    """`after - before` of two success rates over n episodes each, its standard error
    sqrt(p1 (1 - p1) / n + p2 (1 - p2) / n) and the gain in standard errors. With no variance
    (both rates 0 or 1) the se is 0: no gain is 0 standard errors, a gain (0 -> 1) +-inf
    (null in summary.json, which is standard JSON: rl_runtime.track.summary_json)."""
    se = math.sqrt((before * (1 - before) + after * (1 - after)) / n)
    gain = after - before
    unbounded = math.copysign(float("inf"), gain) if gain else 0.0
    in_se = round(gain / se, 2) if se > 0 else unbounded
    return {"gain": round(gain, 4), "se": round(se, 4), "gain_in_se": in_se, "n": n}


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
