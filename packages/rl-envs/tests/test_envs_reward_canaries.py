"""Reward-hacking canaries: outputs a policy could learn to game the graders with. Each rule is
pinned (README, "Rewards: canary rules")."""

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
