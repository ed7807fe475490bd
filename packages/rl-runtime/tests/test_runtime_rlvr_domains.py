"""The RLVR pipeline's reward domains: per-domain dynamic sampling and mixes, tags, custom
reward extras and metrics, refusals by key."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any

import pytest
from rlvr_helpers import SEED, FakeCluster, TextScorer, _plan, _sandboxed_step_and_eval

from rl_config.records import GenerationResult
from rl_runtime.pipelines.rlvr.data import load_rlvr_prompts
from rl_runtime.pipelines.rlvr.metrics import (
    extra_metrics,
)
from rl_runtime.pipelines.rlvr.rollout import GroupGenerator, rollout_batch
from rl_runtime.pipelines.rlvr.scoring import Scored, Scorer


def test_dynamic_sampling_refills_each_domain_its_own_share(tok, tmp_path):
    """`domain_interleave_probs` {a: 0.5, b: 0.5}, 4 prompts a step: 2 of each domain. Domain a's
    groups vary (`1`, `0`), domain b's never do (`1`, `1`: dropped). The refill asks b for its 2
    missing groups, not 1 of a and 1 of b (quotas of the total missing count), so the kept batch
    never holds more than a's share of a: it used to keep 3 groups of a."""
    rows = [{"prompt": f"{d} {i} =", "ground_truth": "1", "tag": d}
            for d in ("a", "b") for i in range(6)]  # fmt: skip
    data = tmp_path / "mixed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan = _plan([str(data)], None, rewards={d: {"reward_fn": "verl_default", "tag_included": [d]}
                                             for d in ("a", "b")})  # fmt: skip
    plan = dataclasses.replace(
        plan, data=dataclasses.replace(plan.data, domain_interleave_probs={"a": 0.5, "b": 0.5})
    )
    prompts = load_rlvr_prompts(plan, tok, SEED)
    domain = {tuple(ids): row.domain for ids, row in zip(prompts.train.ids, prompts.train.rows)}
    cluster = FakeCluster(tok, lambda req, k: "1" if domain[tuple(req.prompt_ids)] == "b" or k == 0
                          else "0")  # fmt: skip
    batch = rollout_batch(cluster, GroupGenerator(TextScorer(), tok), prompts, plan, seed=SEED,
                          index=0)  # fmt: skip

    asked = [domain[tuple(r.prompt_ids)] for r in cluster.requests]
    assert asked == ["a", "a", "b", "b", "b", "b"]  # the refill round: b's 2 missing groups
    kept = [t for t in batch.trajectories[::2]]
    assert len(kept) == 2 and {prompts.train.rows[t.env_seed].domain for t in kept} == {"a"}
    assert batch.metrics["dynamic_sampling/kept_groups"] == 2.0
    assert batch.metrics["dynamic_sampling/dropped_groups"] == 4.0
    assert batch.metrics["dynamic_sampling/filled"] == 0.0


@pytest.mark.parametrize(
    ("probs", "message"),
    [
        ({"verl_default": 1.5}, "domain_interleave_probs: .*must sum to at most 1, got 1.5"),
        ({"verl_default": 0.0}, "domain_interleave_probs: .*must not all be 0"),
        ({"verl_default": 1.5, "a": -0.5}, "domain_interleave_probs: .*must be finite numbers >= 0"),
        ({"math": 1.0}, r"domain_interleave_probs names \['math'\], which are not reward "
                        r"domains; the domains are \['verl_default'\]"),
    ],
)  # fmt: skip
def test_a_bad_domain_mix_is_refused_by_the_plan_naming_the_key(probs, message):
    """Probabilities that do not sum to 1, or a domain no reward scores, are a config error of
    the plan (a dry run says so), not a traceback from the sampler after the model was built."""
    data = {"template": "native", "file_name": "train.parquet", "domain_interleave_probs": probs}
    with pytest.raises(ValueError, match=f"actor_train.data_args.{message}"):
        _plan(["train.parquet"], None, actor_train={"data_args": data})
    assert _plan(["t.parquet"], None, actor_train={"data_args": {
        **data, "domain_interleave_probs": {"verl_default": 1.0}}}).data.domain_interleave_probs  # fmt: skip


def test_a_domain_mix_below_1_gives_the_last_domain_the_remainder_with_a_warning():
    """ROLL's qwen3-235BA22B examples sum to 0.9 (math 0.5, code 0.3, llm_judge 0.1): ROLL gives
    the last domain the rest of each batch. It was refused here; now it plans as ROLL runs it,
    and the plan's notes (a dry run's warnings) name the key, the sum and the last domain's share."""
    rewards = {"rewards": {d: {"worker_cls": "roll.pipeline.rlvr.rewards.math_rule_reward_worker."
                               "MathRuleRewardWorker", "tag_included": [d]}
                           for d in ("a", "b")}}  # fmt: skip
    data = {"template": "native", "file_name": "t.parquet",
            "domain_interleave_probs": {"a": 0.6, "b": 0.3}}  # fmt: skip
    plan = _plan(["t.parquet"], None, actor_train={"data_args": data}, **rewards)
    assert plan.data.domain_interleave_probs == {"a": 0.6, "b": 0.3}
    note = [n for n in plan.notes if "domain_interleave_probs" in n]
    assert note == ["actor_train.data_args.domain_interleave_probs sums to 0.9, not 1: the last "
                    "domain 'b' takes the remainder of each batch (0.4 of it, not 0.3), as ROLL "
                    "does"]  # fmt: skip


def test_trajectories_carry_the_rows_tag_column_for_grouping_by_tags(tok, tmp_path):
    """ROLL's jsonl rows have a `tag` column and no data_source: the trajectories' tag is the
    row's tag, so `reward_normalization.grouping: tags` normalises per tag (it grouped by the
    data_source, `unknown` for every such row: the whole batch) and env/<tag>/* is per tag."""
    from rl_runtime.step.advantages import group_keys
    from rl_runtime.step.collate import collate_trajectories

    rows = [{"prompt": f"{d} {i} =", "ground_truth": "1", "tag": d}
            for d in ("a", "b") for i in range(4)]  # fmt: skip
    data = tmp_path / "tagged.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan = _plan([str(data)], None, dynamic_sampling={"enable": False})
    prompts = load_rlvr_prompts(plan, tok, SEED)
    cluster = FakeCluster(tok, lambda req, k: str(k))
    batch = rollout_batch(cluster, GroupGenerator(TextScorer(), tok), prompts, plan, seed=SEED,
                          index=0)  # fmt: skip
    tags = [prompts.train.rows[t.env_seed].tag for t in batch.trajectories]
    assert [t.tag for t in batch.trajectories] == tags and set(tags) == {"a", "b"}
    collated = collate_trajectories(batch.trajectories, pad_token_id=0)
    assert len(set(group_keys(collated, "tags").tolist())) == 2


EXTRAS_REWARD = """
def score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == ground_truth:
        return {"score": 1.0, "acc": True, "format_ok": 0.5, "pred": solution_str,
                "a/b": 2.0, "inf": float("inf")}
    return {"score": 0.0, **{f"k{i}": 1 for i in range(40)}}
"""


def test_custom_reward_extras_are_logged_per_step_and_held_out_bounded_and_counted(
    tok, tmp_path, capsys
):
    """verl's reward_extra_info: the numeric entries a custom reward returns besides `score`
    reach the driver from the real sandbox and are logged as `reward/extra/<name>` (mean over
    the samples that returned it; held out `val/reward/extra/<name>`); they were dropped. The
    right answer (sample 0) returns acc/format_ok plus a text, a name with `/` and an inf
    (each skipped and counted by reason); the wrong one a dict of 40 extras (too many: all
    dropped, counted once, its score 0.0 kept). jsonl rows without a data_source and no
    `rewards` section: no `reward/unknown/mean` nor `reward/domain/custom/*` (they repeated
    `reward/mean`, `reward/failed`)."""
    fn = tmp_path / "extras_reward.py"
    fn.write_text(EXTRAS_REWARD)
    rows = [{"prompt": f"{i} =", "ground_truth": "1", "tag": "t"} for i in range(6)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan = _plan([str(data)], str(data), dynamic_sampling={"enable": False},
                 custom_reward_function={"path": str(fn), "name": "score"})  # fmt: skip
    prompts = load_rlvr_prompts(plan, tok, SEED)
    cluster = FakeCluster(tok, lambda req, k: "1" if k == 0 else "0")
    batch, held_out = _sandboxed_step_and_eval(plan, prompts, cluster, tok)
    m = batch.metrics
    assert m["reward/mean"] == 0.5 and m["reward/failed"] == 0.0  # every score kept
    extras = {k: v for k, v in m.items() if "extra" in k}
    assert extras == {"reward/extra/acc": 1.0, "reward/extra/format_ok": 0.5,
                      "reward/extra_skipped/bad_name": 4.0, "reward/extra_skipped/not_finite": 4.0,
                      "reward/extra_skipped/not_number": 4.0,
                      "reward/extra_skipped/too_many": 4.0}  # fmt: skip
    assert not [k for k in m if k.startswith(("reward/unknown/", "reward/domain/"))], m
    assert (
        held_out["val/reward/extra/acc"] == 1.0 and held_out["val/greedy/reward/extra/acc"] == 1.0
    )
    assert held_out["val/reward/extra_skipped/too_many"] == 5.0  # one wrong sample per prompt
    warned = [line for line in capsys.readouterr().out.splitlines() if "extras skipped" in line]
    assert len(warned) == 3 and all("domain custom" in line for line in warned), warned
    assert not [line for line in warned if "not_number" in line]  # text extras: only counted


# os.urandom, not uuid: the sandbox process may not be able to import a stdlib module its parent
# had not imported (the package-alone CI step ran it without uuid)
INVENTIVE_REWARD = """
import os
def score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 0.0, "acc": 1, **{os.urandom(16).hex(): 1.0 for _ in range(31)}}
"""


def test_a_reward_that_makes_up_extra_names_cannot_grow_the_metrics_without_end(tok, tmp_path):
    """Each call of this reward returns 31 new names (within the 32 allowed per call): the
    run's scorer logged every one of them, so each step's metrics row (and the tracker's
    history) grew by 31 keys per sample. Now the run keeps its first `MAX_EXTRA_NAMES` names
    (`acc` among them, for every sample) and counts the rest, per sample, as `new_name`."""
    from rl_envs.rewards.extras import MAX_EXTRA_NAMES

    fn = tmp_path / "inventive.py"
    fn.write_text(INVENTIVE_REWARD)
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "1 =", "ground_truth": "1"}) + "\n")
    plan = _plan([str(data)], None, custom_reward_function={"path": str(fn), "name": "score"})
    row = load_rlvr_prompts(plan, tok, SEED).train.rows[0]
    scorer = Scorer(plan.rewards, plan.overlong, plan.response_length, allow_weak_isolation=True)
    try:
        scored = [s for _ in range(3) for s in scorer.score([row] * 2, ["1", "2"], [1, 1])]
    finally:
        scorer.close()
    names = {name for s in scored for name in s.extras}
    assert len(names) == MAX_EXTRA_NAMES and all(s.extras.get("acc") == 1.0 for s in scored)
    assert (
        sum(s.extras_skipped.get("new_name", 0) for s in scored) == 6 * 31 + 1 - MAX_EXTRA_NAMES
    )  # acc + 186 made-up names
    metrics = extra_metrics(scored, "reward")
    assert len([k for k in metrics if k.startswith("reward/extra/")]) == MAX_EXTRA_NAMES
    assert (
        metrics["reward/extra_skipped/new_name"] == 6 * 31 + 1 - MAX_EXTRA_NAMES
    )  # acc + 186 made-up names


def _group(source: str, domain: str | None, rewards: list[float], acc: Sequence[bool] = ()) -> Any:
    """A group of `rewards` for a row of `source` and `domain`; its samples return the extra
    `acc` when given."""
    from types import SimpleNamespace

    from rl_runtime.pipelines.rlvr.metrics import Group

    results = [GenerationResult(request_id="0", prompt_ids=[1], output_ids=[2], finish_reason="stop",
                                output_log_probs=[0.0], weight_version=0) for _ in rewards]  # fmt: skip
    scores = [Scored(r, True, "ok") for r in rewards]
    if acc:
        scores = [dataclasses.replace(s, extras={"acc": float(a)}) for s, a in zip(scores, acc)]
    row = SimpleNamespace(data_source=source, domain=domain)
    return Group(row, [1], results, ["x"] * len(rewards), scores, rewards)


def test_per_source_and_per_domain_rewards_only_where_they_say_more_than_the_totals():
    """One unnamed data source (`unknown`) or the one implicit domain: no per-key metric (it
    only repeated reward/mean: `reward/unknown/mean` for every jsonl run without a data_source).
    Several sources or domains, or a name the user gave (a row's data_source, a `rewards`
    domain): every one (hand-computed means)."""
    from rl_runtime.pipelines.rlvr.metrics import group_metrics

    one = group_metrics([_group("unknown", "custom", [1.0, 0.0])])
    assert not [k for k in one if k.startswith(("reward/unknown/", "reward/domain/"))], one
    named = group_metrics([_group("gsm8k", "math", [1.0, 0.0])], ["math"])
    assert named["reward/gsm8k/mean"] == 0.5 and named["reward/domain/math/mean"] == 0.5
    mixed = group_metrics([_group("unknown", "a", [1.0, 1.0]), _group("gsm8k", "b", [0.0, 0.5])])
    assert (mixed["reward/unknown/mean"], mixed["reward/gsm8k/mean"]) == (1.0, 0.25)
    assert (mixed["reward/domain/a/mean"], mixed["reward/domain/b/mean"]) == (1.0, 0.25)
    assert mixed["reward/domain/a/failed"] == 0.0


def test_a_domain_with_metrics_of_its_own_gets_its_extras():
    """`reward/domain/<domain>/extra/<name>` beside the batch's `reward/extra/<name>` (means of
    the samples that returned it, hand-computed)."""
    from rl_runtime.pipelines.rlvr.metrics import group_metrics

    mixed = group_metrics([_group("s", "a", [1.0, 1.0], [True, True]),
                           _group("s", "b", [0.0, 0.5], [False, False]),
                           _group("s", "b", [0.0, 0.0])])  # fmt: skip
    assert (mixed["reward/domain/a/extra/acc"], mixed["reward/domain/b/extra/acc"]) == (1.0, 0.0)
    assert mixed["reward/extra/acc"] == 0.5
    one = group_metrics([_group("s", "custom", [1.0, 0.0], [True, False])])
    assert one["reward/extra/acc"] == 0.5 and not [k for k in one if "domain" in k]


def test_a_custom_reward_file_that_cannot_be_used_is_named_by_its_key(tmp_path):
    """A missing file, a function the file does not define, or a syntax error: one line naming
    `custom_reward_function` (compose_rlvr's refusal: a dry run lists it, a run stops before it
    builds anything); the run built the model and warmed it up, then ended in a traceback from
    the reward router."""
    from rl_runtime.pipelines.rlvr.compose import custom_reward_problem

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "1 =", "ground_truth": "1"}) + "\n")
    fn = tmp_path / "reward.py"
    fn.write_text("def score(data_source, solution_str, ground_truth, extra_info):\n  return 1\n")
    broken = tmp_path / "broken.py"
    broken.write_text("def score(:\n")
    cases = [
        ({"path": str(tmp_path / "nope.py")}, r"custom_reward_function\.path: .*not found"),
        ({"path": str(fn), "name": "compute"}, r"custom_reward_function .*no top-level .*compute"),
        (
            {"path": str(broken), "name": "score"},
            r"custom_reward_function .*syntax error at line 1",
        ),
    ]
    for custom, message in cases:
        plan = _plan([str(data)], None, custom_reward_function=custom)
        assert re.search(message, custom_reward_problem(plan.rewards) or ""), custom
    plan = _plan([str(data)], None, custom_reward_function={"path": str(fn), "name": "score"})
    assert custom_reward_problem(plan.rewards) is None
    assert custom_reward_problem(_plan([str(data)], None).rewards) is None
