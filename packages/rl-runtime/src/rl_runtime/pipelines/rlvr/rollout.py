"""Single-turn generation of the RLVR pipeline: G samples per prompt over every actor_infer
engine, their rewards per group (`GroupGenerator`), the scored groups as trajectories (one
single-turn `Trajectory` per sample), and a step's rollout with DAPO's dynamic sampling
(`rollout_batch`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from rl_config.records import GenerationRequest, GenerationResult, SamplingParams, Trajectory, Turn
from rl_runtime.asynchrony.queue import PendingBatch, RolloutBatch
from rl_runtime.pipelines.rlvr.compose import RlvrPlan
from rl_runtime.pipelines.rlvr.data import RlvrPrompts, Scored, Scorer
from rl_runtime.pipelines.rlvr.dynamic_sampling import FillResult, fill_quotas
from rl_runtime.pipelines.rlvr.metrics import (
    FAILURES_IN_BATCH,
    Group,
    failure_counts,
    group_metrics,
)
from rl_runtime.state.seeds import generation_round_seed, sample_seed
from rl_runtime.step.collate import shard_rows


def generate(cluster: Any, prompts: list[list[int]], sampling: SamplingParams) -> list:
    """`sampling.n` results per prompt, `[len(prompts)][n]`, sharded over every engine; prompt i
    samples with seed `rl_runtime.state.seeds.sample_seed(sampling.seed, i)` (a function of the batch's seed and its place)."""
    requests = [
        GenerationRequest(
            request_id=str(i),
            prompt_ids=p,
            sampling=msgspec.structs.replace(sampling, seed=sample_seed(sampling.seed or 0, i)),
        )
        for i, p in enumerate(prompts)
    ]
    infer = cluster["actor_infer"]
    chunks = shard_rows(requests, len(infer.workers))
    parts = infer.wait(infer.submit_each("generate", [(c,) for c in chunks]), "generate")
    out: list[list[GenerationResult]] = [[] for _ in prompts]
    for result in (r for part in parts for r in part):
        out[int(result.request_id)].append(result)
    return out


def score_groups(
    scorer: Scorer,
    tokenizer: Any,
    rows: list,
    prompt_ids: list[list[int]],
    results: list[list[GenerationResult]],
    baselines: list[GenerationResult] | None = None,
) -> list[Group]:
    """One `Group` per prompt: its samples decoded and scored (every sample of the batch, and
    each prompt's greedy `baselines` response when given, in one call to the sandboxed scorer),
    the raw rewards (`reward_clip` clamps the normalised rewards when advantages are computed,
    rl_runtime.step.advantages)."""
    scored = [[*res, baselines[i]] for i, res in enumerate(results)] if baselines else results
    texts = [[tokenizer.decode(r.output_ids, skip_special_tokens=True) for r in res]
             for res in scored]  # fmt: skip
    flat = scorer.score(
        [row for row, res in zip(rows, scored) for _ in res],
        [t for ts in texts for t in ts],
        [len(r.output_ids) for res in scored for r in res],
    )
    groups, start = [], 0
    for row, prompt, res, ts in zip(rows, prompt_ids, results, texts, strict=True):
        scores, start = flat[start : start + len(res)], start + len(res)
        group = Group(row, prompt, res, ts[: len(res)], scores, [s.reward for s in scores])
        if baselines:
            group.baseline, start = flat[start], start + 1
        groups.append(group)
    return groups


def within_difficulty(group: Group, difficulty: tuple[float, float] | None) -> bool:
    """ROLL's difficulty filter: the mean of the group's scores (before DAPO's overlong
    penalty, which shapes rewards, not how hard the prompt is) lies strictly between `low` and
    `high` of `difficulty` (always True when it is None)."""
    if difficulty is None:
        return True
    low, high = difficulty
    mean = sum(s.score for s in group.scores) / len(group.scores)
    return low < mean < high


def group_trajectories(
    groups: list[Group],
    step: int,
    max_len_mask: bool,
    difficulty: tuple[float, float] | None = None,
) -> list[Trajectory]:
    """One single-turn Trajectory per sample of `groups` (group id `<step>-<group>`, tag the
    row's tag: ROLL's `tag` column, else its data_source, what `reward_normalization.grouping:
    tags` and the per-tag `env/<tag>/*` metrics group by); with
    `max_len_mask` a truncated response is kept for its group's statistics but not trained on
    (response_mask False), and so are the samples of a group outside `difficulty`
    (`within_difficulty`: ROLL's difficulty_mask). A sample whose reward call failed is marked
    (`info["reward_failed"]`, its kind as `reward_error`): its 0.0 is not data, and
    rl_runtime.step.failures screens it out of training; so is every sample of a group whose greedy
    baseline's reward call failed (no baseline, nothing to compare with). `baseline_reward`: the
    group's greedy baseline reward, when it has one. Per-token weight versions are kept when a
    generation continued under newer weights (partial rollout): the prompt counts as the first
    version."""
    out = []
    for g_index, g in enumerate(groups):
        p = len(g.prompt_ids)
        baseline = g.baseline
        in_range = within_difficulty(g, difficulty)
        for k, (res, reward, own) in enumerate(zip(g.results, g.rewards, g.scores)):
            score = own if baseline is None or baseline.ok else _baseline_failure(baseline)
            o = len(res.output_ids)
            truncated = res.finish_reason == "length"
            train = in_range and not (truncated and max_len_mask)
            success = score.correct
            reason = "max_length" if truncated else ("success" if success else "terminated")
            versions = [res.weight_version] * p + list(res.token_versions)
            out.append(Trajectory(
                traj_id=f"{step}-{g_index}-{k}", group_id=f"{step}-{g_index}",
                tag=g.row.tag, env_seed=g.row.index,
                token_ids=[*g.prompt_ids, *res.output_ids], prompt_length=p,
                response_mask=[False] * p + [train] * o,
                rollout_log_probs=[0.0] * p + list(res.output_log_probs),
                turns=[Turn(turn_idx=0, start=p, end=p + o, reward=reward,
                            truncated=truncated, info=_reward_info(score))],
                episode_reward=reward, success=success, termination_reason=reason,
                weight_version=res.weight_version, failed=False,
                token_versions=versions if res.token_versions else [],
                baseline_reward=baseline.reward if baseline is not None and baseline.ok else None,
            ))  # fmt: skip
    return out


def _baseline_failure(baseline: Scored) -> Scored:
    """A sample's reward record when its group's baseline failed: failed, the baseline's kind."""
    return dataclasses.replace(baseline, kind=f"baseline_{baseline.kind}")


def _reward_info(score: Scored) -> dict[str, Any]:
    if score.ok:
        return {"reward_ok": True}
    return {"reward_ok": False, "reward_failed": True, "reward_error": score.kind}


@dataclass(frozen=True)
class Generated:
    """One generation round's output, not yet scored (`GroupGenerator.generate`)."""

    rows: list
    prompt_ids: list[list[int]]
    results: list[list[GenerationResult]]
    greedy: list[GenerationResult] | None


@dataclass(frozen=True)
class GroupGenerator:
    """Prompts to scored groups: `generate` on every engine, then `score_groups` (the tokenizer
    decodes, the sandboxed `scorer` rewards). The caller owns the scorer."""

    scorer: Scorer
    tokenizer: Any

    def generate(
        self,
        cluster: Any,
        rows: list,
        prompt_ids: list[list[int]],
        sampling: SamplingParams,
        generate_s: list[float] | None = None,
        baseline: SamplingParams | None = None,
    ) -> Generated:
        """The engines' samples of each prompt, and its `baseline` response (one greedy sample
        per prompt) when given; the seconds spent in the engines' generate calls are appended
        to `generate_s` when given."""
        t0 = time.perf_counter()
        results = generate(cluster, prompt_ids, sampling)
        greedy = [res[0] for res in generate(cluster, prompt_ids, baseline)] if baseline else None
        if generate_s is not None:
            generate_s.append(time.perf_counter() - t0)
        return Generated(rows, prompt_ids, results, greedy)

    def score(self, generated: Generated) -> list[Group]:
        """One scored `Group` per prompt of `generated`."""
        g = generated
        return score_groups(self.scorer, self.tokenizer, g.rows, g.prompt_ids, g.results, g.greedy)

    def groups(
        self,
        cluster: Any,
        rows: list,
        prompt_ids: list[list[int]],
        sampling: SamplingParams,
        generate_s: list[float] | None = None,
        baseline: SamplingParams | None = None,
    ) -> list[Group]:
        """`generate`, then `score`."""
        return self.score(self.generate(cluster, rows, prompt_ids, sampling, generate_s, baseline))


def scored_rewards(group: Group) -> list[float]:
    """The group's rewards of the samples that were scored (a failed call's 0.0 is no reward),
    and its baseline's when it has one: what dynamic sampling judges a group's variance by (with
    a baseline, remax, a group whose samples all match each other but not the baseline has
    non-zero advantages and is kept)."""
    own = [r for r, score in zip(group.rewards, group.scores, strict=True) if score.ok]
    baseline = group.baseline
    return [*own, baseline.reward] if baseline is not None and baseline.ok else own


def rollout_batch(
    cluster: Any,
    generator: GroupGenerator,
    prompts: RlvrPrompts,
    plan: RlvrPlan,
    *,
    seed: int,
    index: int,
    defer_scoring: bool = False,
) -> RolloutBatch | PendingBatch:
    """Step `index`'s groups as trajectories: `plan.prompts_per_step` prompts drawn from
    `prompts.sampler`, G samples each, scored, then DAPO's dynamic sampling (`fill_quotas`:
    zero-variance groups dropped, more drawn within the bound; with `domain_interleave_probs`
    each domain refills its own share). Generation round r samples with
    seed `rl_runtime.state.seeds.generation_round_seed(seed, index, groups drawn before r)`. Metrics:
    dynamic_sampling/*, data/*, reward/* and response/* of every generated group (dropped ones
    included), timing/rollout_generate (engine seconds), `reward/failures_in_batch/<kind>` (the
    batch's failed reward calls, dropped groups' included; the recipe adds them up). Only
    actor_infer is called (asynchronous training runs this on the producer thread).

    `defer_scoring` (asynchronous training): with dynamic sampling off, the one generation round
    runs now and the rest (decoding, sandboxed scoring, trajectories) is returned pending
    (`PendingBatch`), for the producer to finish while the next batch generates; with dynamic
    sampling on, a refill depends on the scores, so the batch is finished here."""
    train = prompts.train
    drawn: list[Group] = []  # every generated group, dropped ones included (metrics)
    generate_s: list[float] = []  # per generation round (the rest: decoding, scoring)

    def generate_round(wanted: dict[str | None, int]) -> Generated:
        rows_index = prompts.sampler.draw(wanted)
        round_seed = generation_round_seed(seed, index, len(drawn))
        sampling = msgspec.structs.replace(plan.sampling, seed=round_seed)
        rows = [train.rows[i] for i in rows_index]
        ids = [train.ids[i] for i in rows_index]
        baseline = plan.baseline_sampling(round_seed)
        return generator.generate(cluster, rows, ids, sampling, generate_s, baseline)

    def scored(generated: Generated) -> list[Group]:
        fresh = generator.score(generated)
        drawn.extend(fresh)
        return fresh

    sampler, dynamic = prompts.sampler, plan.dynamic_sampling
    quotas = sampler.quotas(plan.prompts_per_step)

    def fill(draw: Callable[[dict[str | None, int]], list[Group]]) -> RolloutBatch:
        result = fill_quotas(
            draw, scored_rewards, quotas, lambda group: sampler.key_of(group.row),
            enable=dynamic.enable, max_extra_rounds=dynamic.max_extra_rounds,
        )  # fmt: skip
        return _batch(result, drawn, generate_s, prompts, plan, index)

    if not defer_scoring or dynamic.enable:
        return fill(lambda wanted: scored(generate_round(wanted)))
    # one round, as fill_quotas draws it without dynamic sampling: generated now, scored later
    generated = generate_round({key: n for key, n in quotas.items() if n > 0})
    return PendingBatch(index, lambda: fill(lambda _wanted: scored(generated)))


def _batch(
    fill: FillResult[Group],
    drawn: list[Group],
    generate_s: list[float],
    prompts: RlvrPrompts,
    plan: RlvrPlan,
    index: int,
) -> RolloutBatch:
    """The step's RolloutBatch from dynamic sampling's result `fill` and every group generated
    for it (`drawn`)."""
    named = tuple(plan.rewards.domains) if plan.rewards.named else ()  # by a rewards section
    metrics = {**fill.metrics(), **prompts.metrics, **group_metrics(drawn, named)}
    metrics["timing/rollout_generate"] = sum(generate_s)
    counts = failure_counts(drawn)
    metrics.update({f"{FAILURES_IN_BATCH}{k}": float(v) for k, v in sorted(counts.items())})
    trajectories = group_trajectories(fill.groups, index, plan.max_len_mask, plan.difficulty)
    if plan.difficulty is not None and fill.groups:  # ROLL's actor/difficulty_mask_ratio
        kept = sum(within_difficulty(g, plan.difficulty) for g in fill.groups)
        metrics["train/difficulty_mask_ratio"] = kept / len(fill.groups)
    return RolloutBatch(index, trajectories, metrics)
