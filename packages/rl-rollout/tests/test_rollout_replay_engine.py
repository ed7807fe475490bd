"""Rollout replay: an HF engine's generations recorded (`record_generations`) are served again by
the `replay` engine, with no model: the same results for the same requests, the n-th identical
request its n-th recording, an unrecorded request refused by name, weight updates advancing
only the version."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from rl_config.records import GenerationRequest, SamplingParams
from rl_rollout import build_engine
from rl_rollout.engine import Engine
from rl_rollout.registry import engine_option_problems
from rl_rollout.replay_engine import RecordingEngine, ReplayEngine, ReplayError


def _requests(seed: int) -> list[GenerationRequest]:
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=5, seed=seed)
    return [
        GenerationRequest(request_id="a", prompt_ids=[1, 2, 3], sampling=sampling),
        GenerationRequest(request_id="b", prompt_ids=[4, 5], sampling=sampling),
    ]


def test_recorded_generations_are_served_again_without_a_model(tiny_model_dir, tmp_path):
    gen = tmp_path / "generations"
    recording = build_engine("hf_infer", tiny_model_dir, {"record_generations": str(gen)}, seed=7)
    assert isinstance(recording, RecordingEngine)
    try:
        first = asyncio.run(recording.generate(_requests(seed=1)))
        second = asyncio.run(recording.generate(_requests(seed=2)))
        again = asyncio.run(recording.generate(_requests(seed=1)))  # the same requests again
    finally:
        recording.shutdown()
    assert sorted(p.name for p in gen.iterdir()) == [
        "7-000001.msgpack",
        "7-000002.msgpack",
        "7-000003.msgpack",
    ]
    assert [(r.request_id, r.sample_index) for r in first] == [
        ("a", 0),
        ("a", 1),
        ("b", 0),
        ("b", 1),
    ]

    replay = build_engine("replay", tiny_model_dir, {"generations": str(gen)})
    assert isinstance(replay, ReplayEngine) and isinstance(replay, Engine)
    # served by request, whatever the order of the calls: seed 2 first, then seed 1 twice
    assert asyncio.run(replay.generate(_requests(seed=2))) == second
    assert asyncio.run(replay.generate(_requests(seed=1))) == first
    assert asyncio.run(replay.generate(_requests(seed=1)[::-1])) == again[2:] + again[:2]
    with pytest.raises(ReplayError, match=r"request 'a' \(3 prompt tokens.* was not recorded"):
        asyncio.run(replay.generate(_requests(seed=1)))  # a third time: recorded twice only
    with pytest.raises(ReplayError, match="request 'b'"):
        asyncio.run(replay.generate([GenerationRequest(request_id="b", prompt_ids=[4, 6])]))
    replay.update_weights([("w", torch.zeros(1))], version=3)
    assert replay.weight_version == 3 and replay.applied_ticket == 1


def test_replay_options_and_recordings_are_checked(tmp_path):
    assert engine_option_problems("replay", {"generations": "x"}) == {}
    assert set(engine_option_problems("replay", {})) == {"generations"}
    assert set(engine_option_problems("replay", {"generations": "x", "max_batch": 2})) == {
        "max_batch"
    }
    assert engine_option_problems("hf_infer", {"record_generations": "d"}) == {}
    assert set(engine_option_problems("hf_infer", {"record_generations": 3})) == {
        "record_generations"
    }
    with pytest.raises(ReplayError, match="does not exist"):
        ReplayEngine("m", {"generations": str(tmp_path / "none")})
    (tmp_path / "g").mkdir()
    with pytest.raises(ReplayError, match="no recorded generations"):
        ReplayEngine("m", {"generations": str(tmp_path / "g")})
    (tmp_path / "g" / "0-000001.msgpack").write_bytes(b"\x93garbage")
    with pytest.raises(ReplayError, match="0-000001.msgpack: not a recorded call"):
        ReplayEngine("m", {"generations": str(tmp_path / "g")})
    with pytest.raises(ValueError, match="strategy_config.generations"):
        ReplayEngine("m", {})


def test_the_recording_is_atomic_per_call(tiny_model_dir, tmp_path):
    """A call file appears whole (written aside, then renamed): no partial file is left."""
    gen = tmp_path / "g"
    engine = build_engine("hf_infer", tiny_model_dir, {"record_generations": str(gen)}, seed=1)
    try:
        asyncio.run(engine.generate(_requests(seed=3)))
    finally:
        engine.shutdown()
    assert [p.name for p in Path(gen).iterdir()] == ["1-000001.msgpack"]
