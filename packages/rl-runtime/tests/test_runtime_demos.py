"""The scripted (solver) engine behind the supervised warm-up, with and without action noise."""

import asyncio

import pytest

from rl_config.records import GenerationRequest, SamplingParams
from rl_envs import make_env
from rl_envs.solvers import solve
from rl_runtime.pipelines.agentic.demos import ScriptedEngine, tags_without_solver


class _CharTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def _answers(engine, n):
    req = GenerationRequest(request_id="r", prompt_ids=[1], sampling=SamplingParams())
    texts = []
    for _ in range(n):
        (res,) = asyncio.run(engine.generate([req]))
        assert res.output_ids[-1] == 0  # the end-of-turn token closes every answer
        texts.append("".join(chr(i) for i in res.output_ids[:-1]))
    return texts


def _env():
    env = make_env("FrozenLake")
    env.reset(seed=3)
    return env


def test_without_noise_the_engine_plays_the_solver_move():
    engine = ScriptedEngine(_CharTokenizer(), end_token_id=0)
    engine.env = _env()
    assert _answers(engine, 5) == [solve(engine.env)[0]] * 5


def test_full_noise_plays_uniformly_random_valid_actions():
    env = _env()
    engine = ScriptedEngine(_CharTokenizer(), end_token_id=0, action_noise=1.0, seed=7)
    engine.env = env
    texts = _answers(engine, 400)
    valid = {env.state.answer_format.format(action=a) for a in env.action_names}
    assert set(texts) == valid  # every action shows up, nothing else does
    counts = [texts.count(t) for t in valid]
    assert min(counts) > 60  # 100 expected each out of 400 (4 actions)


def test_partial_noise_keeps_the_solver_move_most_likely_and_is_seeded():
    env = _env()
    best = solve(env)[0]
    a = ScriptedEngine(_CharTokenizer(), end_token_id=0, action_noise=0.3, seed=1)
    b = ScriptedEngine(_CharTokenizer(), end_token_id=0, action_noise=0.3, seed=1)
    a.env = b.env = env
    texts = _answers(a, 300)
    assert texts == _answers(b, 300)
    share = texts.count(best) / len(texts)
    assert 0.7 < share < 0.85  # 0.7 + 0.3 / 4 = 0.775 expected


@pytest.mark.parametrize("noise", [-0.1, 1.5])
def test_noise_must_be_a_probability(noise):
    with pytest.raises(ValueError, match="action_noise"):
        ScriptedEngine(_CharTokenizer(), end_token_id=0, action_noise=noise)


def test_tags_the_solver_cannot_play_are_named_with_their_env_type():
    specs = {"C": {"env_type": "countdown", "config": {}},
             "T": {"env_type": "tool_use", "config": {}},
             "F": {"env_type": "frozen_lake", "config": {"size": 3}}}  # fmt: skip
    found = tags_without_solver(["C", "T", "F", "SimpleSokoban", "C"], specs)
    assert found == {"C": "env type 'countdown' has no solver",
                     "T": "env type 'tool_use' has no solver"}  # fmt: skip
