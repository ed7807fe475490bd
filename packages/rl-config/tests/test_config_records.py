"""Round trips and invariants of the wire records."""

import math

import msgspec
import pytest

from rl_config.records import (
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    Trajectory,
    Turn,
    decode,
    encode,
    iter_jsonl,
    oldest_weight_version,
    to_jsonl,
)


def _trajectory(**overrides):
    fields = dict(
        traj_id="t0",
        group_id="g3",
        tag="FrozenLake",
        env_seed=7,
        token_ids=[5, 6, 7, 8, 9, 10],
        prompt_length=2,
        response_mask=[False, False, True, True, False, True],
        rollout_log_probs=[0.0, 0.0, -0.5, -1.25, 0.0, -2.0],
        turns=[
            Turn(turn_idx=0, start=2, end=4, action_text="Left", reward=0.0),
            Turn(turn_idx=1, start=5, end=6, action_text="Down", reward=1.0, terminated=True),
        ],
        episode_reward=1.0,
        success=True,
        termination_reason="success",
        weight_version=3,
        timing={"generate_s": 0.5},
    )
    fields.update(overrides)
    return Trajectory(**fields)


def test_trajectory_msgpack_round_trip_keeps_every_field():
    traj = _trajectory()
    back = decode(encode(traj), Trajectory)
    assert back == traj
    assert back.turns[1].terminated is True
    assert back.num_response_tokens == 3


def test_list_of_records_round_trip_and_jsonl():
    trajs = [_trajectory(traj_id=f"t{i}", env_seed=i) for i in range(3)]
    assert decode(encode(trajs), list[Trajectory]) == trajs
    lines = to_jsonl(trajs)
    assert lines.count(b"\n") == 3
    assert list(iter_jsonl(lines, Trajectory)) == trajs


def test_jsonl_error_names_the_line():
    good = to_jsonl([_trajectory()])
    bad = good + b'{"traj_id": 1}\n'
    with pytest.raises(ValueError, match="line 2"):
        list(iter_jsonl(bad, Trajectory))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(response_mask=[False, True]), "equal lengths"),
        (dict(rollout_log_probs=[0.0]), "equal lengths"),
        (dict(prompt_length=9), "prompt_length"),
        (dict(response_mask=[True, False, True, True, False, True]), "inside the prompt"),
        (dict(turns=[Turn(turn_idx=0, start=1, end=3)]), "turn 0 span"),
        (dict(episode_reward=math.nan), "episode_reward"),
    ],
)
def test_trajectory_invariants_are_enforced(overrides, message):
    with pytest.raises(ValueError, match=message):
        _trajectory(**overrides)


def test_decode_validates_invariants_of_foreign_bytes():
    raw = msgspec.msgpack.encode(
        {
            "traj_id": "x",
            "group_id": "g",
            "tag": "t",
            "env_seed": 0,
            "token_ids": [1, 2],
            "prompt_length": 1,
            "response_mask": [False],
            "rollout_log_probs": [0.0, 0.0],
        }
    )
    with pytest.raises(msgspec.ValidationError, match="equal lengths"):
        decode(raw, Trajectory)
    wrong_type = msgspec.msgpack.encode({"request_id": "r", "prompt_ids": ["a"]})
    with pytest.raises(msgspec.ValidationError, match=r"prompt_ids\[0\]"):
        decode(wrong_type, GenerationRequest)


@pytest.mark.parametrize(
    "kwargs",
    [dict(n=0), dict(temperature=-1.0), dict(top_p=0.0), dict(top_k=0), dict(max_new_tokens=0)],
)
def test_sampling_params_reject_out_of_range(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SamplingParams(**kwargs)


def test_generation_records_round_trip():
    req = GenerationRequest(
        request_id="r1",
        prompt_ids=[1, 2, 3],
        sampling=SamplingParams(n=2, temperature=0.7, top_p=0.9, stop=["</answer>"], seed=3),
    )
    assert decode(encode(req), GenerationRequest) == req
    res = GenerationResult(
        request_id="r1",
        prompt_ids=[1, 2, 3],
        output_ids=[4, 5],
        output_log_probs=[-0.1, -0.2],
        finish_reason="stop",
        weight_version=2,
        sample_index=1,
        stop_reason="</answer>",
    )
    assert decode(encode(res), GenerationResult) == res
    with pytest.raises(ValueError, match="output_log_probs"):
        GenerationResult(
            request_id="r",
            prompt_ids=[1],
            output_ids=[1, 2],
            output_log_probs=[0.0],
            finish_reason="length",
            weight_version=0,
        )
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        GenerationRequest(request_id="r", prompt_ids=[])


def test_oldest_weight_version_reads_model_tokens_only():
    plain = _trajectory(weight_version=5)
    assert oldest_weight_version(plain) == 5
    # an interrupted generation: tokens 2-3 from version 3, token 5 from version 4; the env
    # token at index 4 carries 0 but is not a model token
    mixed = _trajectory(weight_version=4, token_versions=[0, 0, 3, 3, 0, 4])
    assert oldest_weight_version(mixed) == 3
    assert decode(encode(mixed), Trajectory) == mixed
    result = GenerationResult(
        request_id="r",
        prompt_ids=[1],
        output_ids=[2, 3, 4],
        output_log_probs=[-0.1, -0.2, -0.3],
        finish_reason="stop",
        weight_version=7,
        token_versions=[6, 6, 7],
    )
    assert oldest_weight_version(result) == 6


@pytest.mark.parametrize("versions", [[1, 2], [0, 0, 1, 1, -1, 1]])
def test_token_versions_must_match_tokens(versions):
    with pytest.raises(ValueError, match="token_versions"):
        _trajectory(token_versions=versions)
