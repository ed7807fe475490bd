"""A generative judge's text side: verdicts read by their declared rule (hand-written judge
outputs), prompts resolved by name or template, and model domains routed to the caller's
scorer with their failures counted like a rule reward's."""

from __future__ import annotations

import pytest

from rl_envs.rewards import RewardInput
from rl_envs.rewards.judge import (
    DEFAULT_JUDGE_PROMPT,
    JUDGE_PROMPTS,
    judge_messages,
    parse_verdict,
    resolve_judge_prompt,
)
from rl_envs.rewards.manager import RewardOutput
from rl_envs.rewards.router import RewardRouter, reward_router_spec


@pytest.mark.parametrize(
    ("text", "rule", "expected"),
    [
        ("YES", "yes_no", 1.0),
        ("**NO**", "yes_no", 0.0),
        ("No.", "yes_no", 0.0),
        ("yes, it matches (not no)", "yes_no", 1.0),  # the first standalone word decides
        ("The answer does not match: NO", "yes_no", 0.0),  # "not" is no "no"
        ("yesterday", "yes_no", None),  # ROLL's substring test read this as yes
        ("nonsense", "yes_no", None),
        ("", "yes_no", None),
        ("Score: 7", "score_0_10", 0.7),
        ("I'd say score = 10.", "score_0_10", 1.0),
        ("Score: **3.5**", "score_0_10", 0.35),
        ("Score: 0", "score_0_10", 0.0),
        ("Score: 11", "score_0_10", None),  # off the scale: unreadable, not clamped
        ("7/10", "score_0_10", None),
        ("YES", "score_0_10", None),
    ],
)  # fmt: skip
def test_verdicts_are_read_by_their_rule(text, rule, expected):
    got = parse_verdict(text, rule)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_unknown_verdict_rule_is_named():
    with pytest.raises(ValueError, match="unknown verdict rule 'maybe'"):
        parse_verdict("yes", "maybe")


def test_judge_prompt_by_roll_name_default_or_template():
    roll = "Qwen2.5-7B-Instruct-RLVR-prompt"
    assert resolve_judge_prompt(roll, "k") == JUDGE_PROMPTS[roll]
    assert resolve_judge_prompt(roll, "k")[1] == "yes_no"
    assert resolve_judge_prompt(None, "k") == (DEFAULT_JUDGE_PROMPT, "score_0_10")
    own = "Q: {question}\nA: {response}\nRef: {reference}\nYES or NO?"
    assert resolve_judge_prompt(own, "k") == (own, "yes_no")
    with pytest.raises(ValueError, match=r"rewards.j.judge_prompt='Qwen3-judge': neither"):
        resolve_judge_prompt("Qwen3-judge", "rewards.j.judge_prompt")  # ROLL: silently default
    with pytest.raises(ValueError, match=r"rewards.j.judge_prompt: the template's fields"):
        resolve_judge_prompt("{response} {answer}", "rewards.j.judge_prompt")


def test_judge_messages_fill_the_template_and_strip_a_rendered_chat():
    template, _ = resolve_judge_prompt("Q={question} R={response} T={reference}", "k")
    chat = judge_messages(template, "system\nbe nice\nuser\nWhat is 2+2?", "4", 4)
    assert chat == [{"role": "user", "content": "Q=What is 2+2? R=4 T=4"}]


def _items(n: int, domain: str) -> list[RewardInput]:
    return [RewardInput("src", f"r{i}", "1", {}, prompt="q", domain=domain) for i in range(n)]


def test_a_model_domain_is_scored_by_the_callers_scorer_and_its_failures_counted():
    spec = reward_router_spec({"judge": {"worker_cls": "roll.x.LLMJudgeRewardWorker"}})
    assert spec.domains["judge"].reward_fn == "llm_judge" and not spec.unsupported
    seen: list[str] = []

    def scorer(items):
        seen.extend(i.solution_str for i in items)
        return [RewardOutput(1.0, True), RewardOutput(0.0, False, "unreadable_verdict", "?")]

    router = RewardRouter(spec, pool=None, model_scorers={"judge": scorer})  # type: ignore[arg-type]
    items = _items(2, "judge")
    out = router.score(items)
    assert seen == ["r0", "r1"] and [o.ok for o in out] == [True, False]
    assert router.stats["failure.unreadable_verdict"] == 1 and router.stats["calls"] == 2
    metrics = router.metrics(items, out)
    assert metrics["reward/judge/failures"] == 1.0
    assert metrics["reward/failures/unreadable_verdict"] == 1.0


def test_a_model_domain_without_its_scorer_or_a_short_answer_is_an_error():
    spec = reward_router_spec({"rm": {"reward_fn": "reward_model"}})
    with pytest.raises(ValueError, match="rewards.rm: reward reward_model is scored by a model"):
        RewardRouter(spec, pool=None)  # type: ignore[arg-type]
    router = RewardRouter(spec, pool=None, model_scorers={"rm": lambda items: []})  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="rewards.rm: the model scorer returned 0 outputs"):
        router.score(_items(1, "rm"))


@pytest.mark.parametrize(
    ("response", "truth", "reward_type", "score", "correct", "boxed"),
    [
        ("<think>B? no</think>\nThe answer is \\boxed{C}", "C", "soft", 1.0, 1.0, 1.0),
        ("I think the answer is C.", "C) blue", "soft", 0.5, 1.0, 0.0),  # right, no box
        ("I think the answer is C.", "C", "strict", -1.0, 1.0, 0.0),
        ("I think the answer is C.", "C", "loose", 1.0, 1.0, 0.0),
        ("\\boxed{A} then \\boxed{D}", "A", "soft", -0.5, 0.0, 1.0),  # the last box counts
        ("the answer is unclear", "B", "soft", -1.0, 0.0, 0.0),  # no capital letter: no choice
        ("<think>\\boxed{B}</think>no box after thinking, answer is B", "B", "soft", 0.5, 1.0, 0.0),
    ],
)  # fmt: skip
def test_crossthinkqa_reads_the_choice_as_roll_does(response, truth, reward_type, score, correct,
                                                    boxed):  # fmt: skip
    from rl_envs.rewards.rules import crossthinkqa_score

    out = crossthinkqa_score("src", response, truth, reward_type=reward_type)
    assert out["score"] == pytest.approx(score) and out["repetition"] == 0.0
    assert (out["correct"], out["format_ok"]) == (correct, boxed)


def test_crossthinkqa_repetition_penalty_and_domain_keys():
    from rl_envs.rewards.rules import crossthinkqa_score

    looped = "so the answer is " * 8 + "\\boxed{A}"
    out = crossthinkqa_score("src", looped, "A", reward_type="soft")
    assert -0.5 < out["repetition"] < -0.3 and out["score"] == pytest.approx(
        1.0 + out["repetition"]
    )
    spec = reward_router_spec({"mcq": {"worker_cls": "roll.x.CrossThinkQARuleRewardWorker"}})
    assert (
        spec.domains["mcq"].reward_fn == "crossthinkqa"
        and spec.domains["mcq"].reward_type == "soft"
    )
    with pytest.raises(ValueError, match=r"rewards.mcq.reward_type='hard': one of"):
        reward_router_spec({"mcq": {"reward_fn": "crossthinkqa", "reward_type": "hard"}})
    with pytest.raises(ValueError, match=r"rewards.m.reward_type='soft': only crossthinkqa reads"):
        reward_router_spec({"m": {"reward_fn": "math_rule", "reward_type": "soft"}})
