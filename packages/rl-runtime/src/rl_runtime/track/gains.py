"""The gain between two held-out evaluations of a success rate, with its standard error: what
every app's summary reports beside a before/after pair."""

from __future__ import annotations

import math


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
