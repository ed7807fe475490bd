"""Held-out evaluation of the RLVR pipeline: greedy accuracy, sampled accuracy and pass@k over
`val_n_sample` samples per held-out prompt, and the trivial most-common-answer baseline."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from rl_runtime.pipelines.rlvr.compose import RlvrPlan
from rl_runtime.pipelines.rlvr.data import RlvrPrompts
from rl_runtime.pipelines.rlvr.metrics import (
    accuracy_metrics,
    count_failures,
    most_common_answer_accuracy,
)
from rl_runtime.pipelines.rlvr.rollout import GroupGenerator
from rl_runtime.state import seeds


def held_out_accuracy(
    cluster: Any,
    generator: GroupGenerator,
    prompts: RlvrPrompts,
    plan: RlvrPlan,
    seed: int,
    failures: Counter[str] | None = None,
) -> dict[str, float]:
    """On `prompts.val` (nothing without held-out prompts), after handing the devices to
    rollout: greedy (val/greedy/*, with `plan.val_greedy`) and sampled (val/accuracy = mean over
    samples, val/pass@k, ...) accuracy, both seeded `rl_runtime.state.seeds.eval_seed(seed)`, and
    val/baseline_accuracy, timing/eval. With `failures` (the run's totals of the evaluations'
    failed reward calls by kind, updated): val/reward_failures/<kind>."""
    val = prompts.val
    if not val.rows:
        return {}
    t0 = time.perf_counter()
    cluster.enter_phase("rollout")
    eval_seed = seeds.eval_seed(seed)
    out: dict[str, float] = {}
    if plan.val_greedy:
        sampling = plan.val_sampling(eval_seed, greedy=True)
        greedy = generator.groups(cluster, val.rows, val.ids, sampling)
        out.update(accuracy_metrics(greedy, "val/greedy"))
    else:
        greedy = []
    groups = generator.groups(cluster, val.rows, val.ids, plan.val_sampling(eval_seed, False))
    out.update(accuracy_metrics(groups, "val"))
    if failures is not None:
        totals = count_failures([*greedy, *groups], failures)
        out.update({f"val/reward_failures/{k}": v for k, v in totals.items()})
    out["val/baseline_accuracy"] = most_common_answer_accuracy(prompts.train.rows, val.rows)
    out["timing/eval"] = time.perf_counter() - t0
    return out
