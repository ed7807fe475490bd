"""Answer extraction, graders, code-like payloads, reward managers (verl and DAPO)."""

from __future__ import annotations

import os

import pytest

from rl_envs import arith
from rl_envs.rewards import (
    DAPORewardManager,
    RewardInput,
    RewardManager,
    coerce_reward,
    extract_boxed,
    extract_hash_answer,
    grader_target,
    normalize_answer,
    register_reward,
)
from rl_envs.rewards.graders import countdown_score, gsm8k_score, math_score

pytestmark = pytest.mark.xdist_group("dist")  # starts sandbox worker processes


def test_boxed_extraction_handles_nesting_and_picks_last():
    assert extract_boxed(r"first \boxed{1} then \boxed{\frac{a}{b^{2}}}") == r"\frac{a}{b^{2}}"
    assert extract_boxed(r"\boxed{\{1, 2\}}") == r"\{1, 2\}"
    assert extract_boxed(r"\fbox{42}") == "42"
    assert extract_boxed(r"\boxed 7") == "7"
    assert extract_boxed(r"\boxed{unclosed") is None
    assert extract_boxed("no box") is None


def test_hash_extraction_and_normalisation():
    assert extract_hash_answer("work\n#### 1,234\n") == "1,234"
    assert extract_hash_answer("#### 1\n#### 2") == "2"
    assert extract_hash_answer("none") is None
    assert normalize_answer(" $1,000.0$ ") == "1000"
    assert normalize_answer(r"\text{5 apples}.") == "5apples"


def test_gsm8k_and_math_graders():
    assert gsm8k_score("so #### 72", "72") == 1.0
    assert gsm8k_score("so #### 71", "72") == 0.0
    assert gsm8k_score("the answer is 72", "72") == 0.0
    assert gsm8k_score("the answer is 72", "72", method="flexible") == 1.0
    assert math_score(r"\boxed{\dfrac{1}{2}}", "0.5") == 1.0
    assert math_score(r"\boxed{50\%}", "0.5") == 1.0
    assert math_score(r"\boxed{3}", "4") == 0.0
    assert math_score("no box 0.5", "0.5") == 0.0


def test_countdown_grader_requires_each_number_once():
    truth = {"numbers": [2, 3, 4], "target": 14}
    assert countdown_score("<answer>(2 + 3) * 4 - 6</answer>", truth) == pytest.approx(0.1)
    assert countdown_score("<answer>2 + 3 * 4</answer>", truth) == 1.0
    assert countdown_score("<answer>3 * 4 + 2 = 14</answer>", truth) == 1.0
    assert countdown_score("<answer>4 * 4 - 2</answer>", truth) == pytest.approx(0.1)
    assert countdown_score("2 + 3 * 4", truth) == 0.0


def test_safe_arithmetic_rejects_code_and_huge_numbers():
    assert arith.evaluate("2 ** 10 - (3 // 2) % 5") == 1023
    for bad in (
        "__import__('os')",
        "x + 1",
        "(1).__class__",
        "9 ** 9 ** 9",
        "1 / 0",
        "[1, 2]",
        "f'{1}'",
    ):
        with pytest.raises(ValueError):
            arith.evaluate(bad)


def test_coerce_reward():
    assert coerce_reward(True) == (1.0, {}, "")
    assert coerce_reward({"score": 0.5, "acc": True}) == (0.5, {"acc": True}, "")
    for bad in (None, float("nan"), float("inf"), "1.0", [1.0], {"acc": 1}):
        assert coerce_reward(bad)[0] is None


PAYLOADS = [
    r"\boxed{__import__('os').system('touch {marker}')}",
    r"\boxed{eval(\"__import__('os').system('touch {marker}')\")}",
    "#### __import__('os').system('touch {marker}')",
    "<answer>__import__('os').system('touch {marker}')</answer>",
    r"$\boxed{().__class__.__base__.__subclasses__()}$ __import__('os').system('touch {marker}')",
]


@pytest.fixture
def marker(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # writable by the sandbox user too: a payload that ran would leave it
    return shared / "X"


def test_code_payloads_never_execute_in_process(marker):
    for payload in PAYLOADS:
        text = payload.replace("{marker}", str(marker))
        math_score(text, "1")
        gsm8k_score(text, "1", method="flexible")
        countdown_score(text, {"numbers": [1], "target": 1})
        with pytest.raises(ValueError):
            arith.evaluate(text)
    from math_verify import parse, verify

    for payload in PAYLOADS:
        verify(parse("1"), parse(payload.replace("{marker}", str(marker))))
    assert not marker.exists()


def test_code_payloads_never_execute_in_sandboxed_graders(math_pool, marker):
    manager = RewardManager(math_pool)
    items = []
    for payload in PAYLOADS:
        text = payload.replace("{marker}", str(marker))
        for source in ("lighteval/MATH", "openai/gsm8k", "math_dapo"):
            items.append(RewardInput(source, text, "1"))
        items.append(RewardInput("countdown", text, {"numbers": [1], "target": 1}))
    outs = manager.score(items)
    assert all(o.ok for o in outs), [o for o in outs if not o.ok]
    assert all(o.reward <= 0.1 for o in outs)
    answer = math_pool.call(grader_target("answer"), str(marker), "1")
    assert answer.ok and answer.value == 0.0
    assert not marker.exists()


def test_default_reward_manager_dispatches_by_data_source(math_pool):
    manager = RewardManager(math_pool)
    outs = manager.score(
        [
            RewardInput("lighteval/MATH", r"so \boxed{\frac{2}{4}}", "0.5"),
            RewardInput("lighteval/MATH", r"\boxed{x^2+2x+1}", "(x+1)^2"),
            RewardInput("openai/gsm8k", "#### 1,234", "1234"),
            RewardInput("math_dapo", r"\boxed{3}", "4"),
            RewardInput("unknown_source", "x", "y"),
        ]
    )
    assert [o.reward for o in outs] == [1.0, 1.0, 1.0, -1.0, 0.0]
    assert outs[3].extra == {"acc": False, "pred": "3"}
    assert not outs[4].ok and "NotImplementedError" in outs[4].error
    assert manager.stats["failures"] == 1


def test_dapo_overlong_penalty(math_pool):
    manager = DAPORewardManager(
        math_pool, max_resp_len=100, overlong_buffer_len=20, overlong_penalty_factor=1.0
    )
    assert manager.overlong_penalty(80) == 0.0
    assert manager.overlong_penalty(90) == pytest.approx(-0.5)
    assert manager.overlong_penalty(100) == pytest.approx(-1.0)
    assert manager.overlong_penalty(130) == pytest.approx(-1.0)  # capped at the factor
    out = manager.score_one(RewardInput("math_dapo", r"\boxed{4}", "4", response_length=90))
    assert out.reward == pytest.approx(0.5) and out.extra["overlong_penalty"] == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="overlong_buffer_len"):
        DAPORewardManager(math_pool, max_resp_len=10, overlong_buffer_len=20)


def test_reward_registry_rejects_duplicates():
    with pytest.raises(ValueError, match="already registered"):
        register_reward("default", "x:y")
    with pytest.raises(ValueError, match="module:function"):
        register_reward("new_one", "no_colon")


def test_numeric_extras_keep_finite_numbers_and_count_the_rest_by_reason():
    """A reward's extras come from untrusted code: finite numbers and bools under metric names
    are kept (as floats); everything else is skipped and counted, never raised on."""
    from rl_envs.rewards.extras import MAX_EXTRAS, MAX_NAME_CHARS, numeric_extras

    got = numeric_extras({"acc": True, "n": 3, "ratio": 0.25, "pred": "3", "none": None,
                          "nan": float("nan"), "huge": 10**400, "a/b": 1.0, "": 1.0,
                          "x" * (MAX_NAME_CHARS + 1): 1.0, 7: 1.0, "x" * MAX_NAME_CHARS: 2})  # fmt: skip
    assert got.values == {"acc": 1.0, "n": 3.0, "ratio": 0.25, "x" * MAX_NAME_CHARS: 2.0}
    assert got.skipped == {"not_number": 2, "not_finite": 2, "bad_name": 4}
    assert numeric_extras({f"k{i}": 1 for i in range(MAX_EXTRAS + 1)}).skipped == {"too_many": 1}
    assert numeric_extras(["acc", 1.0]).skipped == {"malformed": 1}
    assert len(numeric_extras({f"k{i}": 1 for i in range(MAX_EXTRAS)}).values) == MAX_EXTRAS


def test_extra_names_keep_the_first_distinct_names_and_count_new_ones():
    """A reward can make up new extra names on every call: a consumer logs its first
    `limit` distinct names (known ones for ever after) and counts the rest as `new_name`."""
    from rl_envs.rewards.extras import MAX_EXTRA_NAMES, ExtraNames, RewardExtras

    names = ExtraNames(limit=3)
    first = names.admit(RewardExtras({"a": 1.0, "b": 2.0}, {"bad_name": 1}))
    assert first == RewardExtras({"a": 1.0, "b": 2.0}, {"bad_name": 1})
    second = names.admit(RewardExtras({"c": 3.0, "d": 4.0, "a": 5.0, "e": 6.0}))
    assert second == RewardExtras({"c": 3.0, "a": 5.0}, {"new_name": 2})
    assert names.admit(RewardExtras({"b": 7.0})).values == {"b": 7.0}
    assert ExtraNames().limit == MAX_EXTRA_NAMES
