"""The RLVR recipe's parts without Ray: prompt loading (rlvr_data.load_rlvr_prompts), a step's
rollout with dynamic sampling (rlvr_rollout.rollout_batch) and held-out evaluation
(rlvr_eval.held_out_accuracy), on an in-process fake engine and scorer."""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from rl_config.records import GenerationRequest, GenerationResult
from rl_config.schema import ExperimentConfig
from rl_envs.tasks.arith import write_arith_parquet
from rl_envs.tasks.data import TaskRow
from rl_rollout.templates import get_template
from rl_runtime.asynchrony.queue import PendingBatch, RolloutBatch, finished
from rl_runtime.pipelines.rlvr.compose import RlvrPlan, build_rlvr
from rl_runtime.pipelines.rlvr.data import RowSampler, Scored, Scorer, load_rlvr_prompts
from rl_runtime.pipelines.rlvr.eval import held_out_accuracy
from rl_runtime.pipelines.rlvr.metrics import (
    add_batch_failures,
    extra_metrics,
    most_common_answer_accuracy,
)
from rl_runtime.pipelines.rlvr.rollout import GroupGenerator, rollout_batch

SEED = 42


@pytest.fixture(scope="module")
def tok():
    from rl_rollout.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer()


def _plan(train: list[str], val: str | None, **extra: Any) -> RlvrPlan:
    data: dict[str, Any] = {"template": "native", "file_name": train}
    if val is not None:
        data["eval_file_name"] = val
    cfg = {
        "pretrain": "tiny", "seed": SEED, "rollout_batch_size": 4,
        "num_return_sequences_in_group": 2, "val_batch_size": 5, "val_n_sample": 2,
        "val_greedy": True, "prompt_length": 48, "response_length": 8,
        "dynamic_sampling": {"enable": True, "max_num_gen_batches": 1},
        "actor_train": {"data_args": data},
        "actor_infer": {"generating_args": {"max_new_tokens": 8}}, **extra,
    }  # fmt: skip
    return build_rlvr(ExperimentConfig.model_validate(cfg))


@pytest.fixture(scope="module")
def arith(tmp_path_factory) -> tuple[str, str]:
    """100 `a+b=` prompts, 55 problems (`a+b` = `b+a`): the 81 prompts of 44 problems for training,
    one prompt each of the other 11 held out (train.parquet, test.parquet)."""
    out = tmp_path_factory.mktemp("arith")
    train, val = write_arith_parquet(str(out), kind="add", max_a=9, max_b=9, val_fraction=0.2,
                                     seed=0)  # fmt: skip
    return str(train), str(val)


def _lengths(tok, rows: Sequence[TaskRow]) -> list[int]:
    template = get_template("native", tok)
    return [len(tok(template.prefix(r.prompt), add_special_tokens=False)["input_ids"])
            for r in rows]  # fmt: skip


def test_prompts_are_tokenized_held_out_cut_and_the_sampler_seeded(arith, tok, capsys):
    prompts = load_rlvr_prompts(_plan([arith[0]], arith[1]), tok, SEED)
    assert len(prompts.train.rows) == 81 and len(prompts.val.rows) == 5  # val_batch_size
    assert [r.index for r in prompts.train.rows] == list(range(81))
    assert [len(i) for i in prompts.train.ids] == _lengths(tok, prompts.train.rows)
    assert prompts.metrics == {"data/train_prompts": 81.0, "data/rejected_rows": 0.0,
                               "data/filtered_overlong_prompts": 0.0,
                               "data/val_rejected_rows": 0.0,
                               "data/val_filtered_overlong_prompts": 0.0}  # fmt: skip
    expected = RowSampler(prompts.train.rows, SEED, None)
    assert [prompts.sampler.next(4) for _ in range(3)] == [expected.next(4) for _ in range(3)]
    assert capsys.readouterr().out == ""


def test_rejected_rows_and_overlong_prompts_are_counted_and_printed(arith, tok, tmp_path, capsys):
    """A second training file: one prompt longer than every arithmetic prompt, one broken row."""
    long_row = {"prompt": [{"role": "user", "content": "1+1= " * 30}],
                "reward_model": {"ground_truth": "2"}}  # fmt: skip
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps(long_row) + "\n{not json\n")
    limit = max(_lengths(tok, load_rlvr_prompts(_plan([arith[0]], None), tok, SEED).train.rows))
    capsys.readouterr()
    prompts = load_rlvr_prompts(_plan([arith[0], str(extra)], None, prompt_length=limit), tok, 0)
    assert prompts.metrics == {"data/train_prompts": 81.0, "data/rejected_rows": 1.0,
                               "data/filtered_overlong_prompts": 1.0}  # fmt: skip
    assert len(prompts.train.rows) == 81 and not prompts.val.rows
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("warning: rejected ") and "row 1" in out[0]
    assert out[1] == f"filtered 1 prompts longer than prompt_length={limit}"


def test_overlong_held_out_prompts_are_counted_and_printed(arith, tok, tmp_path, capsys):
    """Held-out prompts longer than prompt_length were dropped without a word: the evaluation
    measured the short prompts only. Two of three held-out prompts here are too long."""

    def row(text: str) -> str:
        return json.dumps({"prompt": [{"role": "user", "content": text}],
                           "reward_model": {"ground_truth": "2"}})  # fmt: skip

    val = tmp_path / "val.jsonl"
    val.write_text("\n".join([row("1+1="), row("1+1= " * 30), row("2+2= " * 40)]) + "\n")
    limit = max(_lengths(tok, load_rlvr_prompts(_plan([arith[0]], None), tok, SEED).train.rows))
    capsys.readouterr()
    prompts = load_rlvr_prompts(_plan([arith[0]], str(val), prompt_length=limit), tok, SEED)
    assert len(prompts.val.rows) == 1
    assert prompts.metrics["data/val_filtered_overlong_prompts"] == 2.0
    assert prompts.metrics["data/val_rejected_rows"] == 0.0
    assert capsys.readouterr().out == (
        f"filtered 2 held-out prompts longer than prompt_length={limit}\n"
    )


def test_truncate_prompt_keeps_the_side_verl_keeps():
    from rl_runtime.pipelines.rlvr.data import truncate_prompt

    ids = [1, 2, 3, 4, 5, 6, 7]
    assert truncate_prompt(ids, 4, "left") == [4, 5, 6, 7]
    assert truncate_prompt(ids, 4, "right") == [1, 2, 3, 4]
    assert truncate_prompt(ids, 5, "middle") == [1, 2, 5, 6, 7]  # 5 // 2 first, 3 last
    assert truncate_prompt(ids, 7, "left") == ids and truncate_prompt(ids, 9, "middle") == ids
    with pytest.raises(ValueError, match="prompt_truncation='drop'"):
        truncate_prompt(ids, 4, "drop")


@pytest.mark.parametrize("how", ["left", "right"])
def test_overlong_prompts_are_truncated_not_dropped_when_asked(arith, tok, tmp_path, how, capsys):
    """prompt_truncation=left|right (verl's data.truncation): a prompt longer than prompt_length
    is kept, cut to its last (left) or first (right) prompt_length tokens, and counted; the
    default drops it (the other test above)."""
    long_row = {"prompt": [{"role": "user", "content": "1+1= " * 30}],
                "reward_model": {"ground_truth": "2"}}  # fmt: skip
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps(long_row) + "\n")
    limit = max(_lengths(tok, load_rlvr_prompts(_plan([arith[0]], None), tok, SEED).train.rows))
    capsys.readouterr()
    plan = _plan([arith[0], str(extra)], None, prompt_length=limit, prompt_truncation=how)
    prompts = load_rlvr_prompts(plan, tok, 0)
    assert prompts.metrics == {"data/train_prompts": 82.0, "data/rejected_rows": 0.0,
                               "data/filtered_overlong_prompts": 0.0,
                               "data/truncated_prompts": 1.0}  # fmt: skip
    (full,) = [
        tok(get_template("native", tok).prefix(long_row["prompt"]), add_special_tokens=False)[
            "input_ids"
        ]
    ]
    assert len(full) > limit and prompts.train.rows[-1].prompt == long_row["prompt"]
    expected = full[-limit:] if how == "left" else full[:limit]
    assert prompts.train.ids[-1] == expected and len(prompts.train.ids[-1]) == limit
    assert capsys.readouterr().out == (
        f"truncated 1 prompts to prompt_length={limit} tokens (prompt_truncation={how})\n"
    )


class TextScorer(Scorer):
    """Reward 1.0 for the response `1`, 0.0 otherwise (no sandbox)."""

    def __init__(self) -> None:  # no sandbox
        pass

    def score(self, rows, texts, lengths) -> list[Scored]:
        return [Scored(float(t == "1"), True, "ok") for t in texts]


class FakeCluster:
    """actor_infer on two fake engines: `answer(request, k)` is sample k's text; requests and
    phases are recorded."""

    def __init__(self, tok, answer) -> None:
        self.tok, self.answer = tok, answer
        self.workers = [0, 1]
        self.requests: list[GenerationRequest] = []
        self.phases: list[str] = []

    def __getitem__(self, role: str) -> FakeCluster:
        assert role == "actor_infer"
        return self

    def enter_phase(self, phase: str) -> None:
        self.phases.append(phase)

    def submit_each(self, method: str, args: list[tuple]) -> list[list[GenerationResult]]:
        assert method == "generate"
        return [[r for req in chunk for r in self._results(req)] for (chunk,) in args]

    def wait(self, refs: list, what: str) -> list:
        return refs

    def _results(self, req: GenerationRequest) -> list[GenerationResult]:
        self.requests.append(req)
        out = []
        for k in range(req.sampling.n):
            ids = self.tok(self.answer(req, k), add_special_tokens=False)["input_ids"]
            out.append(GenerationResult(request_id=req.request_id, prompt_ids=req.prompt_ids,
                                        output_ids=ids, output_log_probs=[0.0] * len(ids),
                                        finish_reason="stop", weight_version=0, sample_index=k))  # fmt: skip
        return out


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


def _sandboxed_step_and_eval(plan: RlvrPlan, prompts: Any, cluster: FakeCluster, tok) -> tuple:
    """Step 0's rollout and the held-out evaluation, scored by the plan's rewards in the real
    sandbox: `(RolloutBatch, held-out metrics)`."""
    scorer = Scorer(plan.rewards, plan.overlong, plan.response_length, allow_weak_isolation=True)
    try:
        generator = GroupGenerator(scorer, tok)
        batch = rollout_batch(cluster, generator, prompts, plan, seed=SEED, index=0)  # fmt: skip
        return batch, held_out_accuracy(cluster, generator, prompts, plan, SEED)
    finally:
        scorer.close()


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
