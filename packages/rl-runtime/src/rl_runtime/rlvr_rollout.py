"""Single-turn generation of the RLVR pipeline: G samples per prompt over every actor_infer
engine, their rewards per group, and the scored groups as trajectories (one single-turn
`Trajectory` per sample)."""

from __future__ import annotations

from typing import Any

import msgspec
import torch

from rl_algos.rewards import clip_rewards
from rl_config.records import GenerationRequest, GenerationResult, SamplingParams, Trajectory, Turn
from rl_runtime.collate import shard_rows
from rl_runtime.rlvr_data import Scorer
from rl_runtime.rlvr_metrics import Group


def generate(cluster: Any, prompts: list[list[int]], sampling: SamplingParams) -> list:
    """`sampling.n` results per prompt, `[len(prompts)][n]`, sharded over every engine; prompt i
    samples with seed `sampling.seed * 1009 + i` (a function of the batch's seed and its place)."""
    requests = [
        GenerationRequest(
            request_id=str(i),
            prompt_ids=p,
            sampling=msgspec.structs.replace(sampling, seed=(sampling.seed or 0) * 1009 + i),
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
    reward_clip: float | None,
) -> list[Group]:
    """One `Group` per prompt: its samples decoded and scored (every sample of the batch in one
    call to the sandboxed scorer), rewards after `reward_clip`."""
    texts = [[tokenizer.decode(r.output_ids, skip_special_tokens=True) for r in res]
             for res in results]  # fmt: skip
    flat = scorer.score(
        [row for row, res in zip(rows, results) for _ in res],
        [t for ts in texts for t in ts],
        [len(r.output_ids) for res in results for r in res],
    )
    groups, start = [], 0
    for row, prompt, res, ts in zip(rows, prompt_ids, results, texts, strict=True):
        scores, start = flat[start : start + len(res)], start + len(res)
        rewards = clip_rewards(torch.tensor([s.reward for s in scores]), reward_clip).tolist()
        groups.append(Group(row, prompt, res, ts, scores, rewards))
    return groups


def group_trajectories(groups: list[Group], step: int, max_len_mask: bool) -> list[Trajectory]:
    """One single-turn Trajectory per sample of `groups` (group id `<step>-<group>`); with
    `max_len_mask` a truncated response is kept for its group's statistics but not trained on
    (response_mask False). Per-token weight versions are kept when a generation continued
    under newer weights (partial rollout): the prompt counts as the first version."""
    out = []
    for g_index, g in enumerate(groups):
        p = len(g.prompt_ids)
        for k, (res, reward, score) in enumerate(zip(g.results, g.rewards, g.scores)):
            o = len(res.output_ids)
            truncated = res.finish_reason == "length"
            train = not (truncated and max_len_mask)
            success = score.ok and score.reward >= 1.0
            reason = "max_length" if truncated else ("success" if success else "terminated")
            versions = [res.weight_version] * p + list(res.token_versions)
            out.append(Trajectory(
                traj_id=f"{step}-{g_index}-{k}", group_id=f"{step}-{g_index}",
                tag=g.row.data_source, env_seed=g.row.index,
                token_ids=[*g.prompt_ids, *res.output_ids], prompt_length=p,
                response_mask=[False] * p + [train] * o,
                rollout_log_probs=[0.0] * p + list(res.output_log_probs),
                turns=[Turn(turn_idx=0, start=p, end=p + o, reward=reward,
                            truncated=truncated, info={"reward_ok": score.ok})],
                episode_reward=reward, success=success, termination_reason=reason,
                weight_version=res.weight_version, failed=False,
                token_versions=versions if res.token_versions else [],
            ))  # fmt: skip
    return out
