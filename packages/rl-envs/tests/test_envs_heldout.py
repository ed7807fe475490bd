"""FrozenLake with random start and goal, held-out splits by content, and the blind baselines."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rl_envs import make_env
from rl_envs.content_split import content_bucket, content_split
from rl_envs.frozen_lake import FrozenLakeState, generate_frozen_lake, solve_frozen_lake
from rl_envs.frozen_lake.baselines import best_fixed_sequence, random_policy_success
from rl_envs.frozen_lake.generator import GOAL, HOLE, START, step_position

RANDOM_ENDS = {"size": 4, "is_slippery": False, "random_start": True, "random_goal": True}


def test_random_start_and_goal_vary_and_keep_a_long_enough_path():
    starts, goals = set(), set()
    for seed in range(200):
        desc = generate_frozen_lake(seed, size=4, random_start=True, random_goal=True,
                                    min_path_length=3)  # fmt: skip
        start = FrozenLakeState(desc, (0, 0)).start
        path = solve_frozen_lake(FrozenLakeState(desc, start))
        assert path is not None and len(path) >= 3
        starts.add(start)
        goals.add(tuple(int(v) for v in np.argwhere(desc == GOAL)[0]))
    assert len(starts) == 16 and len(goals) == 16


def test_default_maps_are_unchanged_corner_to_corner():
    desc = generate_frozen_lake(7, size=4)
    assert desc[0, 0] == START and desc[-1, -1] == GOAL
    assert np.array_equal(desc, generate_frozen_lake(7, size=4, min_path_length=1))


def test_env_starts_the_player_on_the_start_cell():
    env = make_env("frozen_lake", **RANDOM_ENDS)
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        assert env.state.player == env.state.start
        r, c = env.state.player
        assert obs.splitlines()[r][c] == "P"


def test_min_path_length_must_be_positive():
    with pytest.raises(ValueError, match="min_path_length"):
        generate_frozen_lake(0, min_path_length=0)


def test_layout_split_gives_disjoint_content():
    keys = {}
    for split in ("train", "val"):
        env = make_env("frozen_lake", **RANDOM_ENDS, layout_split=split, val_fraction=0.5)
        keys[split] = set()
        for seed in range(300):
            env.reset(seed=seed)
            assert env.split() == split == content_split(env.content_key(), 0.5)
            keys[split].add(env.content_key())
    assert not keys["train"] & keys["val"]
    # the same seeds without a split do land in both sets
    plain = make_env("frozen_lake", **RANDOM_ENDS)
    seen = {content_split((plain.reset(seed=s), plain.content_key())[1], 0.5) for s in range(50)}
    assert seen == {"train", "val"}


def test_content_key_is_stable_during_an_episode_and_deterministic():
    env = make_env("frozen_lake", **RANDOM_ENDS, layout_split="val")
    env.reset(seed=5)
    key = env.content_key()
    env.step("<answer>Left</answer>")
    assert env.content_key() == key
    other = make_env("frozen_lake", **RANDOM_ENDS, layout_split="val")
    other.reset(seed=5)
    assert other.content_key() == key
    assert 0.0 <= content_bucket(key) < 1.0


def test_sokoban_splits_by_its_start_position():
    env = make_env("SimpleSokoban", layout_split="val", val_fraction=0.3)
    env.reset(seed=2)
    key = env.content_key()
    assert env.split() == "val"
    env.step("<answer>Up</answer>")
    assert env.content_key() == key


def test_bad_split_options_are_errors():
    with pytest.raises(ValueError, match="layout_split"):
        make_env("frozen_lake", layout_split="test")
    with pytest.raises(ValueError, match="val_fraction"):
        make_env("frozen_lake", layout_split="val", val_fraction=1.0)


def _maps(n: int, **kw) -> list[FrozenLakeState]:
    out = []
    for seed in range(n):
        desc = generate_frozen_lake(seed, size=3, **kw)
        out.append(FrozenLakeState(desc, FrozenLakeState(desc, (0, 0)).start))
    return out


def _solves(state: FrozenLakeState, seq) -> bool:
    pos = state.player
    for a in seq:
        pos = step_position(state.desc, pos, a)
        if state.desc[pos] == HOLE:
            return False
        if state.desc[pos] == GOAL:
            return True
    return False


def test_best_fixed_sequence_matches_brute_force():
    maps = _maps(40, random_start=True, random_goal=True, p=0.7)
    seq, share = best_fixed_sequence(maps, 4)
    assert share == pytest.approx(sum(_solves(m, seq) for m in maps) / len(maps))
    brute = max(
        sum(_solves(m, s) for m in maps)
        for s in itertools.product(("Left", "Down", "Right", "Up"), repeat=4)
    )
    assert share == pytest.approx(brute / len(maps))


def test_random_policy_success_matches_enumeration():
    maps = _maps(10, random_start=True, random_goal=True, p=0.7)
    actions = ("Left", "Down", "Right", "Up")
    exact = np.mean(
        [np.mean([_solves(m, s) for s in itertools.product(actions, repeat=3)]) for m in maps]
    )
    assert random_policy_success(maps, 3) == pytest.approx(exact)
