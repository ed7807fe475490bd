"""RLVR rewards by domain through the real sandbox: math, code (the row's unit tests), format
regex, and custom functions from a config (verl and TRL signatures, sync and async; raising,
hanging and NaN-returning functions are counted failures with their reason)."""

from __future__ import annotations

import json
import os

import pytest

from rl_envs.rewards import (
    RewardInput,
    build_reward_router,
    load_custom_reward,
    reward_router_spec,
)
from rl_envs.tasks import TaskRow

pytestmark = pytest.mark.xdist_group("dist")  # starts sandbox worker processes

ROLL_REWARDS = {
    "math_rule": {
        "worker_cls": "roll.pipeline.rlvr.rewards.math_rule_reward_worker.MathRuleRewardWorker",
        "tag_included": ["deepmath_103k", "openai/gsm8k"],
        "model_args": {"model_name_or_path": "Qwen/Qwen2.5-7B"},
        "world_size": 8,
    },
    "code_sandbox": {
        "worker_cls": "roll.pipeline.rlvr.rewards.code_sandbox_reward_worker.CodeSandboxRewardWorker",
        "tag_included": ["KodCode"],
        "timeout_s": 1.0,
    },
    "fmt": {"reward_fn": "format", "tag_included": ["fmt"],
            "format_pattern": r"<think>.*</think>\s*<answer>.*</answer>", "timeout_s": 2.0},
}  # fmt: skip

ASSERT_TESTS = json.dumps([{"assert_code": "assert add(1, 2) == 3"},
                           {"assert_code": "def test_neg():\n    assert add(-1, -1) == -2\n"}])  # fmt: skip
IO_TRUTH = json.dumps({"inputs": ["2 3\n", "10 -4\n"], "outputs": ["5\n", "6\n"]})


def _code(body: str) -> str:
    return f"Here is my solution:\n```python\n{body}\n```\n"


def _item(tag: str, solution: str, truth="42", source="src", **columns) -> RewardInput:
    return RewardInput(source, solution, truth, {}, columns={"tag": tag, **columns})


def test_each_domain_through_the_sandbox(math_pool):
    router = build_reward_router(ROLL_REWARDS, None, pool=math_pool)
    code = {"test_cases": ASSERT_TESTS, "case_type": "assert"}
    items = [
        _item("deepmath_103k", r"so the answer is \boxed{\frac{1}{2}}", truth="0.5"),
        _item("deepmath_103k", r"\boxed{41} or maybe \boxed{42}"),  # hedging: no answer
        _item("gsm8k", "3 + 4 = 7\n#### 7", truth="7", source="openai/gsm8k"),
        _item("KodCode", _code("def add(a, b):\n    return a + b"), truth="", **code),
        _item("KodCode", _code("def add(a, b):\n    return a - b if a < 0 else a + b"), **code),
        _item("KodCode", _code("def add(a, b):\n    while True:\n        pass"), **code),
        _item("KodCode", "no code block at all", **code),
        _item("KodCode", _code("a, b = map(int, input().split())\nprint(a + b)"), truth=IO_TRUTH),
        _item("fmt", "<think>hm</think> <answer>4</answer>"),
        _item("fmt", "<answer>4</answer>"),
        _item("untagged", r"\boxed{42}"),  # no domain takes the tag: math_rule, as ROLL
    ]
    outs = router.score(items)
    assert [o.reward for o in outs] == [1.0, 0.0, 1.0, 1.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert all(o.ok for o in outs), [o for o in outs if not o.ok]
    assert outs[4].extra == {"passed": 1, "total": 2, "test_timeouts": 0, "no_code": False}
    assert outs[5].extra["test_timeouts"] == 2  # a hanging program fails its tests, no more
    assert outs[6].extra["no_code"]
    metrics = router.metrics(items, outs)
    assert metrics["reward/code_sandbox/count"] == 5.0
    assert metrics["reward/code_sandbox/mean"] == pytest.approx(2.5 / 5)
    assert metrics["reward/math_rule/mean"] == pytest.approx(3 / 4)
    assert metrics["reward/code_sandbox/extra/test_timeouts"] == pytest.approx(2 / 5)
    assert metrics["reward/failures"] == 0.0


def test_format_regex_that_backtracks_forever_is_a_counted_timeout(math_pool):
    rewards = {"fmt": {"reward_fn": "format", "format_pattern": r"(a+)+$", "timeout_s": 1.0}}
    router = build_reward_router(rewards, None, pool=math_pool)
    outs = router.score([_item("fmt", "a" * 40 + "!")])
    assert not outs[0].ok and outs[0].kind == "timeout" and outs[0].reward == 0.0
    assert router.metrics([_item("fmt", "")], outs)["reward/failures/timeout"] == 1.0


VERL_SYNC = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str.strip() == ground_truth), "length": len(solution_str)}
"""
VERL_ASYNC = """
import asyncio
async def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(0.01)
    return 2.0 if ground_truth in solution_str else -1.0
"""
TRL_SYNC = """
def reward_len(prompts, completions, ground_truth, **kwargs):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(t == g) + 0.5 * (k == "ab") for t, g, k in zip(texts, ground_truth, kwargs["tag"])]
"""
TRL_ASYNC = """
import asyncio
async def reward(prompts, completions, **columns):
    await asyncio.sleep(0)
    return [len(p[-1]["content"]) for p in prompts]
"""
HOSTILE = """
import math, time
def raises(data_source, solution_str, ground_truth, extra_info):
    raise RuntimeError("grader bug")
def hangs(data_source, solution_str, ground_truth, extra_info):
    time.sleep(60)
def nan(data_source, solution_str, ground_truth, extra_info):
    return math.nan
def dict_nan(data_source, solution_str, ground_truth, extra_info):
    return {"score": float("nan"), "acc": 1}
def short(prompts, completions, **kw):
    return [1.0]
def huge(data_source, solution_str, ground_truth, extra_info):
    return 10 ** 400  # a Python int no float holds: float() raised OverflowError in the trainer
def huge_batch(prompts, completions, **kw):
    return [{"score": -(10 ** 400)} for _ in completions]
"""


def _write(tmp_path, name: str, source: str) -> str:
    path = tmp_path / name
    path.write_text(source)
    return str(path)


def _row(i: int, text: str, chat: bool = True, tag: str = "ab") -> TaskRow:
    return TaskRow(i, [{"role": "user", "content": text}], str(i), "custom_src", tag=tag,
                   is_chat=chat, columns={"tag": tag})  # fmt: skip


def test_custom_reward_verl_and_trl_signatures_sync_and_async(math_pool, tmp_path):
    rows = [_row(0, "q?"), _row(1, "longer question?", tag="zz")]
    items = [RewardInput.from_row(rows[0], "0"), RewardInput.from_row(rows[1], "wrong")]

    def score(source: str, name: str, **section) -> list:
        path = _write(tmp_path, f"{name}.py", source)
        cfg = {"path": path, "name": name, **section}
        router = build_reward_router(None, cfg, pool=math_pool)
        assert router.spec.default_domain == "custom"
        return router.score(items)

    outs = score(VERL_SYNC, "compute_score")
    assert [o.reward for o in outs] == [1.0, 0.0] and outs[0].extra == {"length": 1}
    assert [o.reward for o in score(VERL_ASYNC, "compute_score")] == [2.0, -1.0]
    assert load_custom_reward(_write(tmp_path, "t.py", TRL_SYNC), "reward_len").style == "trl"
    assert [o.reward for o in score(TRL_SYNC, "reward_len")] == [1.5, 0.0]
    async_trl = load_custom_reward(_write(tmp_path, "a.py", TRL_ASYNC), "reward")
    assert async_trl.style == "trl" and async_trl.is_async
    assert [o.reward for o in score(TRL_ASYNC, "reward")] == [2.0, 16.0]
    # a text prompt gives TRL string completions
    text = RewardInput.from_row(_row(0, "q?", chat=False), "0")
    path = _write(tmp_path, "s.py", TRL_SYNC)
    router = build_reward_router(None, {"path": path, "name": "reward_len"}, pool=math_pool)
    assert router.score([text])[0].reward == 1.5


def test_custom_reward_that_raises_hangs_or_returns_nan_is_counted(math_pool, tmp_path):
    path = _write(tmp_path, "hostile.py", HOSTILE)
    items = [RewardInput.from_row(_row(0, "q?"), "0"), RewardInput.from_row(_row(1, "r?"), "1")]
    expected = {"raises": "exception", "hangs": "timeout", "nan": "not_finite",
                "dict_nan": "not_finite", "short": "bad_result", "huge": "not_finite",
                "huge_batch": "not_finite"}  # fmt: skip
    for name, kind in expected.items():
        router = build_reward_router(
            None, {"path": path, "name": name}, pool=math_pool, timeout_s=1.0
        )
        outs = router.score(items)
        assert [(o.ok, o.kind, o.reward) for o in outs] == [(False, kind, 0.0)] * 2, name
        metrics = router.metrics(items, outs)
        assert metrics["reward/failures"] == 2.0 and metrics[f"reward/failures/{kind}"] == 2.0
        assert metrics["reward/custom/failures"] == 2.0
        assert router.stats[f"failure.{kind}"] == 2
    assert (
        "RuntimeError: grader bug"
        in build_reward_router(None, {"path": path, "name": "raises"}, pool=math_pool)
        .score(items[:1])[0]
        .error
    )


def test_router_spec_refuses_what_it_cannot_score(tmp_path):
    with pytest.raises(ValueError, match=r"rewards.ifeval.worker_cls .*IFEval"):
        reward_router_spec({"ifeval": {"worker_cls": "roll.x.GeneralRuleRewardWorker"}})
    spec = reward_router_spec(
        {"ifeval": {"worker_cls": "roll.x.GeneralRuleRewardWorker"}, **ROLL_REWARDS},
        allow_unsupported=True,
    )
    assert list(spec.unsupported) == ["ifeval"] and spec.default_domain == "math_rule"
    assert spec.domain_of("KodCode") == "code_sandbox"
    assert spec.domain_of(None, "openai/gsm8k") == "math_rule"
    with pytest.raises(ValueError, match="reward_fn 'bogus'|unknown reward 'bogus'"):
        reward_router_spec({"d": {"reward_fn": "bogus"}})
    with pytest.raises(ValueError, match="already in rewards.a.tag_included"):
        reward_router_spec({"a": {"reward_fn": "math_rule", "tag_included": ["t"]},
                            "b": {"reward_fn": "math_rule", "tag_included": ["t"]}})  # fmt: skip
    with pytest.raises(ValueError, match="format_pattern"):
        reward_router_spec({"f": {"reward_fn": "format"}})
    with pytest.raises(ValueError, match="no rewards domain uses it"):
        reward_router_spec(ROLL_REWARDS, {"path": "r.py", "name": "f"})
    with pytest.raises(ValueError, match="custom_reward_function.path"):
        reward_router_spec({"c": {"reward_fn": "custom"}})
    assert reward_router_spec(None, {"path": None}).default_domain == "verl_default"


def test_a_verl_default_domain_takes_the_rows_no_other_domain_does():
    """verl's remote code sandbox, translated: code data sources to code_sandbox, every other
    row to verl's dispatch by data_source (without math_rule, which ROLL's rows default to)."""
    spec = reward_router_spec(
        {"verl_default": {"reward_fn": "verl_default"},
         "code_sandbox": {"reward_fn": "code_sandbox", "tag_included": ["apps", "taco"]}}
    )  # fmt: skip
    assert spec.default_domain == "verl_default"
    assert spec.domain_of(None, "taco") == "code_sandbox"
    assert spec.domain_of(None, "numina_olympiads") == "verl_default"


def test_custom_file_signature_is_checked_without_running(tmp_path):
    marker = tmp_path / "ran"
    path = _write(tmp_path, "bad.py", f"open({str(marker)!r}, 'w').close()\n"
                                       "def f(x):\n    return 1\n")  # fmt: skip
    with pytest.raises(ValueError, match="TRL style"):
        load_custom_reward(path, "f")
    with pytest.raises(ValueError, match="TRL style"):
        load_custom_reward(path, "f", style="trl")
    assert not marker.exists() and os.path.exists(path)


def test_unknown_domain_is_a_counted_failure(math_pool):
    router = build_reward_router(
        {"code_sandbox": {"tag_included": ["KodCode"]}, "fmt": ROLL_REWARDS["fmt"]},
        None,
        pool=math_pool,
    )
    assert router.spec.default_domain is None
    outs = router.score([_item("stray", "x")])
    assert outs[0].kind == "unknown_domain" and router.stats["failure.unknown_domain"] == 1


def test_reading_rewards_score_in_chunks_and_a_hostile_response_fails_alone(math_pool):
    """A reward that only parses the response scores a batch in one sandbox call per worker;
    a response that hangs its chunk (regex backtracking) fails alone, as a timeout."""
    rewards = {"fmt": {"reward_fn": "format", "format_pattern": r"(a+)+$", "timeout_s": 3.0}}
    router = build_reward_router(rewards, None, pool=math_pool)
    texts = ["a" * (i + 1) for i in range(10)] + ["a" * 40 + "!"] + ["b"] * 5
    before = math_pool.stats()
    outs = router.score([_item("fmt", t) for t in texts])
    assert [o.reward for o in outs] == [1.0] * 10 + [0.0] * 6
    assert [o.kind for o in outs] == ["ok"] * 10 + ["timeout"] + ["ok"] * 5
    after = math_pool.stats()
    assert after["batches"] - before.get("batches", 0) == 2  # one per worker
    assert after["batch_fallbacks"] - before.get("batch_fallbacks", 0) == 1
    assert router.stats["failure.timeout"] == 1


def test_code_rewards_never_share_a_call(math_pool):
    """Code that runs the response gets a fresh sandbox call per response."""
    rewards = {"code": {"reward_fn": "code_sandbox", "timeout_s": 10.0}}  # per test: CI is loaded
    router = build_reward_router(rewards, None, pool=math_pool)
    code = {"test_cases": ASSERT_TESTS, "case_type": "assert"}
    items = [_item("code", _code("def add(a, b):\n    return a + b"), **code)] * 3
    before = math_pool.stats()
    outs = router.score(items)
    assert [(o.reward, o.extra["test_timeouts"]) for o in outs] == [(1.0, 0)] * 3
    after = math_pool.stats()
    assert after.get("batches", 0) == before.get("batches", 0)
    assert after["calls"] - before["calls"] == 3


SPOOFING = """
def score(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "0":
        raise RuntimeError("a failure to hide")
    return {"score": 0.0, "mean": 1.0, "count": 99, "failures": 0, "acc": 0.5}
"""


def test_a_rewards_extras_cannot_overwrite_the_domains_own_metrics(math_pool, tmp_path):
    """Extras are named by untrusted code: one named `mean`, `count` or `failures` had replaced
    the domain's own metric (a failed call hidden, a 0 score logged as 1)."""
    router = build_reward_router(
        None, {"path": _write(tmp_path, "spoof.py", SPOOFING), "name": "score"}, pool=math_pool
    )
    items = [RewardInput.from_row(_row(0, "q?"), "0"), RewardInput.from_row(_row(1, "r?"), "1")]
    metrics = router.metrics(items, router.score(items))
    assert metrics["reward/custom/mean"] == 0.0
    assert metrics["reward/custom/count"] == 2.0
    assert metrics["reward/custom/failures"] == 1.0 and metrics["reward/failures"] == 1.0
    extras = {k: v for k, v in metrics.items() if "/extra/" in k}
    assert extras == {"reward/custom/extra/mean": 1.0, "reward/custom/extra/count": 99.0,
                      "reward/custom/extra/failures": 0.0, "reward/custom/extra/acc": 0.5}  # fmt: skip


def test_crossthinkqa_domain_scores_in_the_sandbox_with_its_reward_type(math_pool):
    rewards = {
        "mcq": {"worker_cls": "roll.x.CrossThinkQARuleRewardWorker", "reward_type": "strict"}
    }
    router = build_reward_router(rewards, None, pool=math_pool)
    items = [_item("mcq", "answer is \\boxed{B}", "B"), _item("mcq", "the answer is B", "B")]
    out = router.score(items)
    assert [(o.reward, o.ok) for o in out] == [(1.0, True), (-1.0, True)]
    assert out[1].extra["correct"] == 1.0 and out[1].extra["format_ok"] == 0.0
