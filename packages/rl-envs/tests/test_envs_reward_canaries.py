"""Reward-hacking canaries: outputs a policy could learn to game the graders with. Each rule is
pinned (docs/rl-envs.md, "Rewards: canary rules")."""

from __future__ import annotations

import pytest

from rl_envs.rewards import DAPORewardManager, RewardInput
from rl_envs.rewards.extraction import final_number
from rl_envs.rewards.graders import dapo_score, gsm8k_score, math_score

pytestmark = pytest.mark.xdist_group("dist")  # one test starts sandbox worker processes

REASONING = "Each box holds 6 apples and there are 7 boxes, so 6 * 7 = 42 apples in total.\n"


def test_several_different_boxed_answers_score_nothing():
    hedge = r"It is \boxed{41} or maybe \boxed{42}."
    spray = " ".join(rf"\boxed{{{n}}}" for n in range(1, 101))
    assert math_score(hedge, "42") == 0.0
    assert math_score(spray, "42") == 0.0
    assert dapo_score(hedge, "42")["score"] == -1.0
    assert dapo_score("Answer: 41\nAnswer: 42", "42")["score"] == -1.0
    # the same answer twice (restating it) is not hedging
    assert math_score(r"\boxed{42}, so again \boxed{42}", "42") == 1.0
    assert math_score(r"\boxed{\frac{1}{2}} i.e. \boxed{\dfrac{1}{2}}", "0.5") == 1.0


def test_hash_spam_scores_nothing():
    assert gsm8k_score("#### 40\n#### 41\n#### 42", "42") == 0.0
    assert gsm8k_score("#### 40 #### 41 #### 42", "42") == 0.0
    assert gsm8k_score("#### 40\n#### 41\n#### 42", "42", method="flexible") == 0.0
    assert gsm8k_score("#### 40, 41, 42", "42") == 0.0
    assert gsm8k_score(REASONING + "#### 42\n#### 42", "42") == 1.0


def test_gsm8k_flexible_rejects_a_list_of_candidates():
    count_up = " ".join(str(n) for n in range(1, 11))  # "1 2 3 4 5 6 7 8 9 10"
    for text in ("1 2 3 ... 10", count_up, f"{count_up} done", "It is 9, 10 or 11."):
        assert final_number(text) is None, text
        assert gsm8k_score(text, "10", method="flexible") == 0.0, text
    # one final number, even after arithmetic, is still an answer
    for text in ("so 3 + 7 = 10", "The answer is 10.", "I have 3 pens and 10 pencils"):
        assert gsm8k_score(text, "10", method="flexible") == 1.0, text


@pytest.mark.parametrize("gold,wrong", [("42", "41"), ("1,234", "1,243")])
def test_answer_without_reasoning_is_judged_like_any_answer(gold, wrong):
    """Outcome rewards (verl, DeepSeek-R1): reasoning is neither required nor paid for. A bare
    answer scores exactly what the same answer after reasoning scores, and a bare number without
    the answer marker scores nothing in strict mode."""
    for answer in (gold, wrong):
        bare, reasoned = f"#### {answer}", REASONING + f"#### {answer}"
        assert gsm8k_score(bare, gold) == gsm8k_score(reasoned, gold)
        assert gsm8k_score(bare, gold, format_score=0.1) == gsm8k_score(
            reasoned, gold, format_score=0.1
        )
        assert math_score(rf"\boxed{{{answer}}}", gold) == math_score(
            REASONING + rf"\boxed{{{answer}}}", gold
        )
    assert gsm8k_score(f"#### {gold}", gold) == 1.0
    assert gsm8k_score(gold, gold) == 0.0


def test_padding_earns_nothing_and_truncation_loses(math_pool):
    padding = "Let me think. " * 2000
    assert math_score(padding + r"\boxed{42}", "42") == math_score(r"\boxed{42}", "42") == 1.0
    assert math_score(r"\boxed{42" + padding, "42") == 0.0  # cut off at the length limit
    manager = DAPORewardManager(
        math_pool, "default", max_resp_len=100, overlong_buffer_len=20, overlong_penalty_factor=1.0
    )
    short, padded, cut = manager.score(
        [
            RewardInput("math_dapo", r"\boxed{42}", "42", response_length=10),
            RewardInput("math_dapo", padding + r"\boxed{42}", "42", response_length=100),
            RewardInput("math_dapo", r"\boxed{42" + padding, "42", response_length=100),
        ]
    )
    assert all(o.ok for o in (short, padded, cut))
    assert short.reward == 1.0
    assert padded.reward == 0.0  # +1 correct, -1 for filling the buffer
    assert cut.reward == -2.0  # -1 no answer, -1 overlong


CODE_TARGET = "rl_envs.rewards.code_tests:code_sandbox_score"
ASSERTS = [{"assert_code": "assert f(1) == 2"}, {"assert_code": "assert f(5) == 6"}]
FORGE_REPORT = (  # writes what a passing test reports (without this test's nonce) to every pipe
    "import os\n"
    "for fd in range(3, 256):\n"
    "    try:\n"
    "        os.write(fd, b'R' + bytes(16) + b'6\\n')\n"
    "    except OSError:\n"
    "        pass\n"
    "os._exit(0)\n"
)


def _code_score(pool, program: str, **tests) -> float:
    result = pool.call(CODE_TARGET, "code", f"```python\n{program}```", None, {}, **tests)
    assert result.ok, result
    return result.value["score"]


@pytest.mark.parametrize(
    "program",
    [
        "import sys\nsys.exit(0)\n",
        "import sys\nsys.exit()\n",
        "import os\nos._exit(0)\n",
        "raise SystemExit(0)\n",
        "def f(x):\n    raise SystemExit(0)\n",  # exits from inside the asserts
        FORGE_REPORT,
    ],
    ids=["sys.exit(0)", "sys.exit()", "os._exit(0)", "SystemExit(0)", "exit-in-f", "forged-report"],
)
def test_code_that_exits_before_its_asserts_run_scores_nothing(math_pool, program):
    """A test passes only when its assert ran: the test process reports it after the asserts,
    with a nonce sent to it only then. Exiting early (any code) or writing a report is a fail."""
    assert _code_score(math_pool, program, test_cases=ASSERTS, case_type="assert") == 0.0


def test_code_exits_keep_honest_programs_scoring(math_pool):
    honest = "def f(x):\n    return x + 1\n"
    assert _code_score(math_pool, honest, test_cases=ASSERTS, case_type="assert") == 1.0
    half = "def f(x):\n    return 2 if x == 1 else 0\n"
    assert _code_score(math_pool, half, test_cases=ASSERTS, case_type="assert") == 0.5
    io_tests = {"test_cases": [{"stdin": "5\n", "expected_stdout": "6\n"}], "case_type": "stdin"}
    # an stdin/stdout program may end with sys.exit(0): its output is what is judged
    exits = "import sys\nprint(int(input()) + 1)\nsys.exit(0)\n"
    assert _code_score(math_pool, exits, **io_tests) == 1.0
    assert _code_score(math_pool, "import sys\nprint(6)\nsys.exit(1)\n", **io_tests) == 0.0
    assert _code_score(math_pool, FORGE_REPORT, **io_tests) == 0.0


def test_code_cannot_write_the_sandbox_calls_result(math_pool):
    """The test process closes every descriptor but its own report pipes before the program
    runs: junk written to every pipe fails the program's own test, never the reward call."""
    junk = (
        "import os\nfor fd in range(3, 256):\n    try:\n        os.write(fd, b'[' * 60000)\n"
        "    except OSError:\n        pass\ndef f(x):\n    return x + 1\n"
    )
    result = math_pool.call(CODE_TARGET, "code", f"```python\n{junk}```", None, {},
                            test_cases=ASSERTS, case_type="assert")  # fmt: skip
    assert result.ok and result.kind == "ok", result
    assert result.value["score"] == 0.0 and result.value["total"] == 2
