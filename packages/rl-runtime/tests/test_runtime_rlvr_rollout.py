"""The RLVR pipeline's rollout and evaluation without Ray: refilled groups, deferred scoring,
held-out accuracy, failed reward calls, ReMax baselines, overlong penalties."""

from __future__ import annotations

from collections import Counter

import pytest
from rlvr_helpers import SEED, FakeCluster, TextScorer, _lengths, _plan, _sandboxed_step_and_eval

from rl_config.records import GenerationRequest
from rl_runtime.asynchrony.queue import PendingBatch, RolloutBatch, finished
from rl_runtime.pipelines.rlvr.compose import RlvrPlan
from rl_runtime.pipelines.rlvr.data import RowSampler, load_rlvr_prompts
from rl_runtime.pipelines.rlvr.eval import held_out_accuracy
from rl_runtime.pipelines.rlvr.metrics import (
    add_batch_failures,
    most_common_answer_accuracy,
)
from rl_runtime.pipelines.rlvr.rollout import GroupGenerator, rollout_batch
from rl_runtime.pipelines.rlvr.scoring import Scored


def test_rollout_refills_dropped_groups_with_the_round_seed(arith, tok):
    """Prompt i of a round answers `1` then `0` when i is even, `0` twice when odd (dropped):
    4 groups, 2 kept; the refill round asks for 2, keeps 1; the bound (1 extra round) stops it."""
    plan = _plan([arith[0]], arith[1])
    prompts = load_rlvr_prompts(plan, tok, SEED)
    cluster = FakeCluster(tok, lambda req, k: "1" if int(req.request_id) % 2 == 0 == k else "0")
    generator = GroupGenerator(TextScorer(), tok)
    batch = rollout_batch(cluster, generator, prompts, plan, seed=SEED, index=5)

    expected = RowSampler(prompts.train.rows, SEED, None)
    drawn = expected.next(4) + expected.next(2)
    assert [r.prompt_ids for r in cluster.requests] == [prompts.train.ids[i] for i in drawn]
    round_seeds = [SEED * 100_003 + 5 * 7, SEED * 100_003 + 5 * 7 + 4 * 100_000_007]
    assert [r.sampling.seed for r in cluster.requests] == [
        *(round_seeds[0] * 1009 + i for i in range(4)), *(round_seeds[1] * 1009 + i for i in range(2))]  # fmt: skip
    assert all(r.sampling.n == 2 for r in cluster.requests)

    m = batch.metrics
    assert batch.index == 5 and len(batch.trajectories) == 3 * 2
    assert [t.group_id for t in batch.trajectories[::2]] == ["5-0", "5-1", "5-2"]
    assert [t.episode_reward for t in batch.trajectories] == [1.0, 0.0] * 3
    assert {k: m[k] for k in m if k.startswith("dynamic_sampling/")} == {
        "dynamic_sampling/rounds": 2.0, "dynamic_sampling/dropped_groups": 3.0,
        "dynamic_sampling/generated_groups": 6.0, "dynamic_sampling/kept_groups": 3.0,
        "dynamic_sampling/filled": 0.0}  # fmt: skip
    assert m["reward/mean"] == pytest.approx(3 / 12)  # every generated group, dropped ones too
    assert m["data/train_prompts"] == 81.0
    assert not [k for k in m if k.startswith("reward/failures")]  # none of its calls failed
    assert m["timing/rollout_generate"] >= 0.0
    assert cluster.phases == []  # the caller hands the devices to rollout


def test_deferred_scoring_generates_now_and_scores_when_finished(arith, tok):
    """Asynchronous rollout (`defer_scoring`), dynamic sampling off: the engines are called at
    once, the sandboxed scorer only when the pending batch is finished (the producer's finisher
    thread, while the next batch generates), and the finished batch equals the one scored at
    once. With dynamic sampling on, a refill needs the scores: the batch comes back finished."""

    class CountingScorer(TextScorer):
        calls = 0

        def score(self, rows, texts, lengths) -> list[Scored]:
            CountingScorer.calls += 1
            return super().score(rows, texts, lengths)

    plan = _plan([arith[0]], arith[1], dynamic_sampling={"enable": False})
    answer = lambda req, k: "1" if int(req.request_id) % 2 == 0 == k else "0"  # noqa: E731
    batches = []
    for defer in (True, False):
        prompts = load_rlvr_prompts(plan, tok, SEED)
        cluster = FakeCluster(tok, answer)
        generator = GroupGenerator(CountingScorer(), tok)
        CountingScorer.calls = 0
        out = rollout_batch(cluster, generator, prompts, plan, seed=SEED, index=3,
                            defer_scoring=defer)  # fmt: skip
        assert len(cluster.requests) == 4  # generated either way
        if defer:
            assert isinstance(out, PendingBatch) and out.index == 3 and CountingScorer.calls == 0
            out = out.finish()
        assert isinstance(out, RolloutBatch) and CountingScorer.calls == 1
        batches.append(out)
    deferred, direct = batches
    assert deferred.trajectories == direct.trajectories
    drop = "timing/rollout_generate"
    assert {k: v for k, v in deferred.metrics.items() if k != drop} == {
        k: v for k, v in direct.metrics.items() if k != drop}  # fmt: skip
    dynamic = _plan([arith[0]], arith[1])  # dynamic sampling on (the default)
    prompts = load_rlvr_prompts(dynamic, tok, SEED)
    out = rollout_batch(FakeCluster(tok, answer), GroupGenerator(TextScorer(), tok), prompts,
                        dynamic, seed=SEED, index=3, defer_scoring=True)  # fmt: skip
    assert isinstance(out, RolloutBatch)


def test_held_out_accuracy_greedy_sampled_and_baseline(arith, tok):
    plan = _plan([arith[0]], arith[1])
    prompts = load_rlvr_prompts(plan, tok, SEED)
    # greedy: always right; sampled: the first of 2 samples right on even prompts only
    cluster = FakeCluster(tok, lambda req, k: "1" if req.sampling.temperature == 0 or
                          (int(req.request_id) % 2 == 0 == k) else "0")  # fmt: skip
    out = held_out_accuracy(cluster, GroupGenerator(TextScorer(), tok), prompts, plan, SEED)

    assert cluster.phases == ["rollout"]
    eval_seed = SEED * 100_003 + 1
    greedy, sampled = cluster.requests[:5], cluster.requests[5:]
    assert [r.sampling.seed for r in greedy] == [eval_seed * 1009 + i for i in range(5)]
    assert [r.sampling.seed for r in sampled] == [eval_seed * 1009 + i for i in range(5)]
    assert all(r.sampling.n == 1 and r.sampling.temperature == 0 for r in greedy)
    assert all(r.sampling.n == 2 for r in sampled)
    assert out["val/greedy/accuracy"] == 1.0 and out["val/greedy/num_prompts"] == 5.0
    assert out["val/accuracy"] == pytest.approx(3 * 0.5 / 5)
    assert out["val/pass@k"] == pytest.approx(3 / 5)
    assert out["val/baseline_accuracy"] == most_common_answer_accuracy(
        prompts.train.rows, prompts.val.rows)  # fmt: skip
    assert out["timing/eval"] >= 0.0


def test_held_out_accuracy_without_held_out_prompts_is_empty(arith, tok):
    plan = _plan([arith[0]], None)
    cluster = FakeCluster(tok, lambda req, k: "1")
    generator = GroupGenerator(TextScorer(), tok)
    assert held_out_accuracy(cluster, generator, load_rlvr_prompts(plan, tok, SEED), plan, 0) == {}
    assert cluster.requests == [] and cluster.phases == []


class TimeoutScorer(TextScorer):
    """The response `x` times out (a failed call); otherwise as `TextScorer`."""

    def score(self, rows, texts, lengths) -> list[Scored]:
        ok = super().score(rows, texts, lengths)
        return [Scored(0.0, False, "timeout") if t == "x" else s for t, s in zip(texts, ok)]


def test_failed_reward_calls_count_into_the_callers_totals_rollout_and_evaluation_apart(arith, tok):
    """A training rollout batch counts its own failed calls (`reward/failures_in_batch/*`),
    which the recipe adds to the run's totals when it learns on the batch (`reward/failures/*`,
    the trainer's state); an evaluation adds to the evaluation's totals
    (`val/reward_failures/*`), never one into the other (an asynchronous run evaluates on the
    trainer while rollout draws ahead)."""
    plan = _plan([arith[0]], arith[1], dynamic_sampling={"enable": False})
    prompts = load_rlvr_prompts(plan, tok, SEED)
    cluster = FakeCluster(tok, lambda req, k: "x" if k == 0 else "1")  # sample 0 of each fails
    generator = GroupGenerator(TimeoutScorer(), tok)
    rollout_totals, eval_totals = Counter({"error": 1}), Counter()
    batch = finished(rollout_batch(cluster, generator, prompts, plan, seed=SEED, index=0))
    in_batch = {k: v for k, v in batch.metrics.items() if k.startswith("reward/failures")}
    assert in_batch == {"reward/failures_in_batch/timeout": 4.0}  # 4 prompts, one failed each
    failures = add_batch_failures(batch.metrics, rollout_totals)
    assert rollout_totals == {"error": 1, "timeout": 4}
    assert failures == {"reward/failures/error": 1.0, "reward/failures/timeout": 4.0}
    for _ in range(2):
        out = held_out_accuracy(cluster, generator, prompts, plan, SEED, failures=eval_totals)
    # 5 held-out prompts, greedy (1 sample: sample 0) and sampled (2): 10 failures a time
    assert eval_totals == {"timeout": 20} and out["val/reward_failures/timeout"] == 20.0
    assert rollout_totals == {"error": 1, "timeout": 4}
    assert "val/reward_failures/timeout" not in held_out_accuracy(
        cluster, generator, prompts, plan, SEED)  # fmt: skip


def test_every_prompt_longer_than_prompt_length_is_a_data_error_naming_the_shortest(arith, tok):
    from rl_envs.tasks.dataset import DataError

    shortest = min(_lengths(tok, load_rlvr_prompts(_plan([arith[0]], None), tok, SEED).train.rows))
    with pytest.raises(DataError, match=rf"prompt_length={shortest - 1} .*shortest has {shortest}"):
        load_rlvr_prompts(_plan([arith[0]], None, prompt_length=shortest - 1), tok, SEED)


def _remax_plan(arith) -> RlvrPlan:
    return _plan([arith[0]], arith[1], adv_estimator="remax",
                 reward_normalization={"method": "identity"})  # fmt: skip


def test_remax_rollout_scores_one_greedy_baseline_per_prompt_and_keeps_groups_it_separates(
    arith, tok
):
    """remax: each round also asks every prompt for one greedy response, scored with the samples;
    each trajectory carries its group's baseline reward. Samples answer `0` twice; the greedy
    answer is `1` on even prompts: those groups have zero variance among their samples but not
    against the baseline (advantage -1), so dynamic sampling keeps them and drops the odd ones."""
    plan = _remax_plan(arith)
    assert plan.baseline_rollout and not _plan([arith[0]], arith[1]).baseline_rollout
    prompts = load_rlvr_prompts(plan, tok, SEED)
    cluster = FakeCluster(tok, lambda req, k: "1" if req.sampling.temperature == 0
                          and int(req.request_id) % 2 == 0 else "0")  # fmt: skip
    generator = GroupGenerator(TextScorer(), tok)
    batch = rollout_batch(cluster, generator, prompts, plan, seed=SEED, index=0)  # fmt: skip

    expected = RowSampler(prompts.train.rows, SEED, None)
    drawn = [expected.next(4), expected.next(2)]  # 2 groups kept, 2 more drawn, 1 kept
    sampled = [r for r in cluster.requests if r.sampling.temperature != 0]
    greedy = [r for r in cluster.requests if r.sampling.temperature == 0]
    assert [r.prompt_ids for r in greedy] == [prompts.train.ids[i] for i in drawn[0] + drawn[1]]
    assert [r.prompt_ids for r in sampled] == [r.prompt_ids for r in greedy]
    assert all(r.sampling.n == 1 and r.sampling.top_k == -1 for r in greedy)
    assert all(r.sampling.n == 2 for r in sampled)
    assert [r.sampling.max_new_tokens for r in greedy] == [8] * 6
    assert len(batch.trajectories) == 3 * 2
    assert [t.episode_reward for t in batch.trajectories] == [0.0] * 6
    assert [t.baseline_reward for t in batch.trajectories] == [1.0] * 6
    assert batch.metrics["dynamic_sampling/dropped_groups"] == 3.0
    assert batch.metrics["reward/baseline_mean"] == pytest.approx(3 / 6)  # every drawn group
    assert batch.metrics["reward/mean"] == 0.0  # the samples only


def test_remax_group_whose_baseline_reward_call_failed_is_screened_out_and_counted(arith, tok):
    """A group without a baseline cannot be trained on: its samples are marked failed with the
    baseline's kind (rl_runtime.step.failures screens them out) and the failed baseline call counts
    into the run's totals."""
    from rl_runtime.step.failures import failure_kind

    plan = _plan([arith[0]], arith[1], adv_estimator="remax",
                 reward_normalization={"method": "identity"},
                 dynamic_sampling={"enable": False})  # fmt: skip
    prompts = load_rlvr_prompts(plan, tok, SEED)
    cluster = FakeCluster(tok, lambda req, k: ("x" if int(req.request_id) == 1 else "0")
                          if req.sampling.temperature == 0 else str(k))  # fmt: skip
    batch = rollout_batch(cluster, GroupGenerator(TimeoutScorer(), tok), prompts, plan,
                          seed=SEED, index=0)  # fmt: skip
    assert batch.metrics["reward/failures_in_batch/timeout"] == 1.0
    by_group = [batch.trajectories[i : i + 2] for i in range(0, 8, 2)]
    assert [[failure_kind(t) for t in g] for g in by_group] == [
        [None, None], ["reward", "reward"], [None, None], [None, None]]  # fmt: skip
    assert {t.turns[0].info["reward_error"] for t in by_group[1]} == {"baseline_timeout"}
    assert [t.baseline_reward for g in by_group for t in g] == [0.0, 0.0, None, None] + [0.0] * 4
    assert [t.episode_reward for t in by_group[1]] == [0.0, 1.0]  # its own rewards are kept


def test_overlong_penalty_shapes_the_reward_not_the_accuracy(arith, tok):
    """DAPO's overlong penalty lowers the reward of a response in the buffer; the response is
    still right. With the buffer the whole response budget, every response is penalised (reward
    < 1), yet the accuracy metrics and the trajectories' success count the right answers (the
    real sandboxed GSM8K rule scores `#### <answer>`)."""
    plan = _plan([arith[0]], arith[1], dynamic_sampling={"enable": False},
                 overlong_penalty={"enable": True, "buffer_length": 8})  # fmt: skip
    prompts = load_rlvr_prompts(plan, tok, SEED)
    truth = {tuple(ids): row.ground_truth for ps in (prompts.train, prompts.val)
             for ids, row in zip(ps.ids, ps.rows)}  # fmt: skip

    def answer(req: GenerationRequest, k: int) -> str:  # sample 0 (and greedy) right, 1 wrong
        return f"#### {truth[tuple(req.prompt_ids)]}" if k == 0 else "#### 999"

    cluster = FakeCluster(tok, answer)
    batch, held_out = _sandboxed_step_and_eval(plan, prompts, cluster, tok)
    right = batch.trajectories[::2]
    assert all(0.0 < t.episode_reward < 1.0 for t in right)  # penalised ...
    assert [t.success for t in batch.trajectories] == [True, False] * 4  # ... and still right
    assert batch.metrics["reward/accuracy"] == 0.5
    assert batch.metrics["reward/mean"] < 0.5
    assert held_out["val/greedy/accuracy"] == 1.0
    assert held_out["val/accuracy"] == 0.5 and held_out["val/pass@k"] == 1.0
