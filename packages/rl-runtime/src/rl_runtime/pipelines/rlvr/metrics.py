"""RLVR metrics: rewards per domain, response lengths and truncation of a batch of groups, and
held-out accuracy with its standard error, pass@k and the before/after summary columns."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from statistics import mean
from typing import Any

from rl_config.records import GenerationResult
from rl_runtime.pipelines.rlvr.data import UNNAMED_DATA_SOURCE
from rl_runtime.pipelines.rlvr.scoring import Scored


@dataclass
class Group:
    """The G samples of one prompt: results, decoded texts, reward records, final rewards; the
    reward record of the prompt's greedy baseline response when the rollout ran one (remax)."""

    row: Any
    prompt_ids: list[int]
    results: list[GenerationResult]
    texts: list[str]
    scores: list[Scored]
    rewards: list[float]
    baseline: Scored | None = None


#: a rollout batch's failed reward calls by kind, `<prefix><kind>` (rl_runtime.pipelines.rlvr.rollout);
#: the recipe adds them to the run's totals, `reward/failures/<kind>`, when it learns on the batch
FAILURES_IN_BATCH = "reward/failures_in_batch/"


def failure_counts(groups: list[Group]) -> Counter[str]:
    """The failed reward calls of `groups` (their samples' and baselines') by kind."""
    scores = [s for g in groups for s in (*g.scores, *([g.baseline] if g.baseline else []))]
    return Counter(s.kind for s in scores if not s.ok)


def count_failures(groups: list[Group], totals: Counter[str]) -> dict[str, float]:
    """Add the failed reward calls of `groups` to the run's `totals` by kind (updated in place);
    the totals as metrics `<kind>: count`."""
    totals.update(failure_counts(groups))
    return {kind: float(n) for kind, n in sorted(totals.items())}


def add_batch_failures(metrics: dict[str, float], totals: Counter[str]) -> dict[str, float]:
    """Add a batch's `FAILURES_IN_BATCH` counts (in its `metrics`) to the run's `totals` (in
    place); the totals as metrics `reward/failures/<kind>`."""
    totals.update({
        key.removeprefix(FAILURES_IN_BATCH): int(v)
        for key, v in metrics.items()
        if key.startswith(FAILURES_IN_BATCH)
    })  # fmt: skip
    return {f"reward/failures/{kind}": float(n) for kind, n in sorted(totals.items())}


def _quantile(ordered: list[int], q: float) -> float:
    """The `q` quantile of sorted values (nearest rank: the smallest value with at least a
    fraction `q` of the values at or below it)."""
    return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)])


def group_metrics(groups: list[Group], named_domains: Collection[str] = ()) -> dict[str, float]:
    """reward/* (mean, accuracy, per data_source `reward/<data_source>/mean`, per reward domain
    `reward/domain/<domain>/{mean,failed}`, and `reward/extra/<name>`: the mean of each numeric
    extra a reward returned over the scored samples that returned it, with
    `reward/extra_skipped/<reason>` counting the extras left out), response/* (length mean,
    median, 90th percentile, max, truncation) of `groups`.

    Per data_source and per domain metrics are logged only where they say more than the totals
    (`_split_keys`): for several sources (domains) in the batch, or for one the user named (a
    row's own data_source; a domain of the `rewards` section, `named_domains`). A logged domain
    also gets its extras, `reward/domain/<domain>/extra/<name>`."""
    if not groups:
        return {}
    samples = [(g.row.data_source, r, s, res) for g in groups
               for r, s, res in zip(g.rewards, g.scores, g.results)]  # fmt: skip
    out = {
        "reward/mean": mean(r for _, r, _, _ in samples),
        "reward/accuracy": mean(float(s.correct) for _, _, s, _ in samples),
        "reward/failed": float(sum(not s.ok for _, _, s, _ in samples)),
        "response/length_mean": mean(len(res.output_ids) for *_, res in samples),
        "response/length_max": float(max(len(res.output_ids) for *_, res in samples)),
        "response/length_p50": _quantile(sorted(len(res.output_ids) for *_, res in samples), 0.5),
        "response/length_p90": _quantile(sorted(len(res.output_ids) for *_, res in samples), 0.9),
        "response/truncated_rate": mean(
            float(res.finish_reason == "length") for *_, res in samples
        ),
        **extra_metrics([s for _, _, s, _ in samples], "reward"),
    }
    baselines = [g.baseline.reward for g in groups if g.baseline is not None and g.baseline.ok]
    if baselines:  # the greedy responses' reward (remax's baseline)
        out["reward/baseline_mean"] = mean(baselines)
    sources = {d for d, *_ in samples}
    for source in _split_keys(sources, sources - {UNNAMED_DATA_SOURCE}):
        out[f"reward/{source}/mean"] = mean(r for d, r, _, _ in samples if d == source)
    domains = {g.row.domain or "unknown" for g in groups}
    for domain in _split_keys(domains, named_domains):
        scores = [(r, s) for g in groups if (g.row.domain or "unknown") == domain
                  for r, s in zip(g.rewards, g.scores)]  # fmt: skip
        out[f"reward/domain/{domain}/mean"] = mean(r for r, _ in scores)
        out[f"reward/domain/{domain}/failed"] = float(sum(not s.ok for _, s in scores))
        extras = extra_metrics([s for _, s in scores], f"reward/domain/{domain}")
        out.update({k: v for k, v in extras.items() if "/extra/" in k})
    return out


def _split_keys(keys: set[str], named: Collection[str]) -> list[str]:
    """The keys (data sources, domains) worth a metric of their own: every one when there are
    several; else the one if the user named it (one unnamed key's metric would only repeat the
    batch's total: `reward/unknown/mean` was `reward/mean` for every jsonl run without a
    data_source)."""
    return sorted(keys) if len(keys) > 1 else [k for k in keys if k in named]


def extra_metrics(scores: Sequence[Scored], prefix: str) -> dict[str, float]:
    """`<prefix>/extra/<name>`: the mean of each extra over the `scores` that returned it;
    `<prefix>/extra_skipped/<reason>`: the extras left out (rl_envs.rewards.extras), when any."""
    values: dict[str, list[float]] = {}
    skipped: Counter[str] = Counter()
    for score in scores:
        for name, value in score.extras.items():
            values.setdefault(name, []).append(value)
        skipped.update(score.extras_skipped)
    out = {f"{prefix}/extra/{name}": mean(v) for name, v in sorted(values.items())}
    out.update({f"{prefix}/extra_skipped/{k}": float(n) for k, n in sorted(skipped.items())})
    return out


def accuracy_metrics(groups: list[Group], prefix: str) -> dict[str, float]:
    """`<prefix>/accuracy` (mean over samples), its standard error over prompts, `pass@k`, the
    responses' lengths and the rewards' extras (`<prefix>/reward/extra/<name>`)."""
    per_prompt = [mean(float(s.correct) for s in g.scores) for g in groups]
    n = len(per_prompt)
    acc = mean(per_prompt)
    sd = math.sqrt(sum((p - acc) ** 2 for p in per_prompt) / max(1, n - 1))
    return {
        f"{prefix}/accuracy": acc,
        f"{prefix}/accuracy_se": sd / math.sqrt(n),
        f"{prefix}/pass@k": mean(float(p > 0) for p in per_prompt),
        f"{prefix}/num_prompts": float(n),
        f"{prefix}/reward_failed": float(sum(not s.ok for g in groups for s in g.scores)),
        **{
            f"{prefix}/{k.split('/', 1)[1]}": v
            for k, v in group_metrics(groups).items()
            if k.startswith("response/")
        },
        **extra_metrics([s for g in groups for s in g.scores], f"{prefix}/reward"),
    }


def most_common_answer_accuracy(train_rows: list[Any], held_out: list[Any]) -> float:
    """Accuracy on `held_out` of always answering the most frequent training answer (a trivial
    baseline; ground truths compared as text)."""
    common = Counter(str(r.ground_truth) for r in train_rows).most_common(1)[0][0]
    return mean(float(str(r.ground_truth) == common) for r in held_out)


SUMMARY = {
    "greedy": "val/greedy/accuracy",
    "greedy_se": "val/greedy/accuracy_se",
    "sampled": "val/accuracy",
    "sampled_se": "val/accuracy_se",
    "pass@k": "val/pass@k",
    "baseline": "val/baseline_accuracy",
}


def summary_row(metrics: dict[str, float]) -> dict[str, float | str]:
    """Held-out accuracy columns of the before/after table."""
    return {name: float(metrics[key]) for name, key in SUMMARY.items() if key in metrics}


def held_out_gains(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """`gain <key>` of each held-out accuracy both evaluations have: `gain` (after - before),
    its standard error `se` and `gain_in_se`. Greedy accuracy and pass@k are proportions over
    n prompts (rl_runtime.track.gains.proportion_gain); the sampled accuracy (a mean
    over each prompt's samples) takes its two evaluations' standard errors over prompts,
    sqrt(se_before^2 + se_after^2). Both treat the evaluations as independent, which the same
    held-out prompts make cautious (a paired difference would have a smaller error)."""
    from rl_runtime.track.gains import proportion_gain

    out: dict[str, Any] = {}
    for key, prefix in (("val/greedy/accuracy", "val/greedy"), ("val/accuracy", "val"),
                        ("val/pass@k", "val")):  # fmt: skip
        n = int(after.get(f"{prefix}/num_prompts", 0))
        if key not in before or key not in after or not n:
            continue
        gain = proportion_gain(before[key], after[key], n)
        if key == "val/accuracy" and {"val/accuracy_se"} <= before.keys() & after.keys():
            se = math.hypot(before["val/accuracy_se"], after["val/accuracy_se"])
            g = after[key] - before[key]
            gain["se"] = round(se, 4)
            gain["gain_in_se"] = round(g / se, 2) if se > 0 else gain["gain_in_se"]
        out[f"gain {key}"] = gain
    return out
