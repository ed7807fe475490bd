"""Sokoban and FrozenLake through the Env protocol: generation, solvers, rewards, termination."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest

import rl_envs
from rl_envs import make_env, solve, solve_actions
from rl_envs.frozen_lake import FrozenLakeState, generate_frozen_lake, has_path, solve_frozen_lake
from rl_envs.frozen_lake.generator import GOAL, HOLE, START
from rl_envs.sokoban import generate_sokoban, parse_level, solve_sokoban
from rl_envs.sokoban.state import move

VARIANTS = {
    "SimpleSokoban": {"dim_room": (6, 6), "num_boxes": 1, "search_depth": 30},
    "LargerSokoban": {"dim_room": (8, 8), "num_boxes": 2, "search_depth": 10},
}


def _brute_force_solvable(state, depth: int) -> bool:
    """Plain exhaustive search over all action sequences of length <= depth."""
    for n in range(depth + 1):
        for seq in itertools.product(("Up", "Down", "Left", "Right"), repeat=n):
            boxes, player = state.boxes, state.player
            for a in seq:
                out = move(state.fixed, boxes, player, a)
                boxes, player = out.boxes, out.player
            if all(state.fixed[b] == 2 for b in boxes):
                return True
    return False


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_generated_sokoban_levels_are_solvable_and_unsolved(variant):
    for seed in range(60):
        level = generate_sokoban(seed, **VARIANTS[variant])
        assert len(level.boxes) == VARIANTS[variant]["num_boxes"]
        assert len(level.targets) == len(level.boxes)
        assert not level.is_solved()
        path = solve_sokoban(level)
        assert path, f"seed {seed} unsolvable"


def test_sokoban_bfs_is_optimal_against_brute_force():
    for seed in range(12):
        level = generate_sokoban(seed, dim_room=(6, 6), num_boxes=1, search_depth=30)
        path = solve_sokoban(level)
        assert path is not None
        if len(path) <= 5:
            assert not _brute_force_solvable(level, len(path) - 1)


def test_sokoban_same_seed_same_level_and_seeds_differ():
    a = make_env("SimpleSokoban")
    b = make_env("SimpleSokoban")
    assert a.reset(seed=7)[0] == b.reset(seed=7)[0]
    observations = {a.reset(seed=s)[0] for s in range(20)}
    assert len(observations) > 15


def test_sokoban_rewards_exact_for_push_onto_target():
    env = make_env("sokoban", format_penalty=-0.15)
    env.reset(seed=0)
    env.set_state(parse_level("#######\n#P_X_O#\n#######"))
    _, r1, t1, _, i1 = env.step("<answer>Right</answer>")
    _, r2, t2, _, _ = env.step("<answer>Right</answer>")
    _, r3, t3, tr3, i3 = env.step("<answer>Right</answer>")
    assert (r1, t1) == (pytest.approx(-0.1), False)
    assert (r2, t2) == (pytest.approx(-0.1), False)
    assert r3 == pytest.approx(-0.1 + 1.0 + 10.0)
    assert t3 and not tr3 and i3["success"] and not i1["success"]
    assert env.render() == "#######\n#___PS#\n#######".replace("PS", "P√")


def test_sokoban_push_off_target_and_blocked_moves():
    env = make_env("sokoban")
    env.reset(seed=0)
    env.set_state(parse_level("#######\n#P√___#\n#__X_O#\n#######"))
    _, reward, terminated, _, info = env.step("<answer>Right</answer>")
    assert reward == pytest.approx(-0.1 - 1.0) and not terminated
    assert info["action_is_effective"]
    # Up into the wall: no change, still the step penalty.
    before = env.render()
    _, reward, _, _, info = env.step("<answer>up</answer>")
    assert reward == pytest.approx(-0.1) and env.render() == before
    assert info["action_is_valid"] and not info["action_is_effective"]


def test_format_penalty_unparsable_and_unknown_action():
    env = make_env("SimpleSokoban", format_penalty=-0.15)
    obs, _ = env.reset(seed=1)
    o, r, t, tr, info = env.step("I think I go right")
    assert r == pytest.approx(-0.15) and o == obs and not t and not tr
    assert info == info | {"format_ok": False, "action_is_valid": False, "success": False}
    o, r, _, _, info = env.step("<answer>Jump</answer>")
    assert r == pytest.approx(-0.15) and o == obs
    assert info["format_ok"] and not info["action_is_valid"]
    assert env.actions_left == env.max_steps - 2


def test_think_pattern_requires_think_block():
    env = make_env("FrozenLakeThink")
    env.reset(seed=0)
    _, _, _, _, info = env.step("<answer>Down</answer>")
    assert not info["format_ok"]
    _, _, _, _, info = env.step("<think>go down</think>\n<answer> Down </answer>")
    assert info["format_ok"] and info["action_is_valid"]


def test_max_steps_truncates_and_step_after_end_raises():
    env = make_env("SimpleSokoban", max_steps=3)
    env.reset(seed=2)
    flags = [env.step("nonsense")[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]
    with pytest.raises(rl_envs.EpisodeOverError):
        env.step("<answer>Up</answer>")


def test_multiple_actions_per_step():
    env = make_env("sokoban", max_actions_per_step=2)
    env.reset(seed=0)
    env.set_state(parse_level("#######\n#P_X_O#\n#######"))
    _, reward, _, _, info = env.step("<answer>Right || Right</answer>")
    assert info["actions"] == ["Right", "Right"] and reward == pytest.approx(-0.2)
    _, _, _, _, info = env.step("<answer>Right || Right || Right</answer>")
    assert not info["action_is_valid"]


@pytest.mark.parametrize("tag", rl_envs.TAGS)
def test_every_tag_solved_by_expert_demonstration(tag):
    env = make_env(tag)
    for seed in range(5):
        env.reset(seed=seed)
        texts = solve(env)
        assert texts and all(env.parse(t).action_is_valid for t in texts)
        total, terminated = 0.0, False
        for text in texts:
            _, reward, terminated, truncated, info = env.step(text)
            total += reward
            if terminated or truncated:
                break
        if len(texts) <= env.max_steps:
            assert terminated and info["success"]
            if tag.startswith("Frozen"):
                assert total == pytest.approx(1.0)
            else:
                expected = -0.1 * len(texts) + 10.0 + _onto_minus_off(env, texts)
                assert total == pytest.approx(expected)


def _onto_minus_off(env, texts):
    """Replays the demonstration on a fresh copy and counts box on/off target events."""
    replay = make_env(env_tag_of(env))
    replay.reset(seed=env.seed)
    net = 0
    st = replay.state
    boxes, player = st.boxes, st.player
    for text in texts:
        out = move(st.fixed, boxes, player, replay.parse(text).actions[0])
        net += out.pushed_onto_target - out.pushed_off_target
        boxes, player = out.boxes, out.player
    return net


def env_tag_of(env):
    return {
        (6, 6, "#"): "SimpleSokoban",
        (8, 8, "#"): "LargerSokoban",
        (6, 6, "W"): "SokobanDifferentGridVocab",
    }[(*env.dim_room, env.grid_lookup[0])]


def test_different_grid_vocab_renders_and_explains_symbols():
    env = make_env("SokobanDifferentGridVocab")
    obs, _ = env.reset(seed=3)
    assert set(obs) <= set("WABCDEF\n") and "#" not in obs
    assert "W: wall" in env.instruction() and "D: box" in env.instruction()


def test_frozen_lake_maps_have_path_and_bfs_is_optimal():
    for seed in range(100):
        desc = generate_frozen_lake(seed, size=6, p=0.6)
        assert has_path(desc) and desc[0, 0] == START and desc[-1, -1] == GOAL
        path = solve_frozen_lake(FrozenLakeState(desc=desc, player=(0, 0)))
        assert path is not None and len(path) >= 10  # Manhattan distance is a lower bound
        # the path never crosses a hole
        pos = (0, 0)
        for a in path:
            dr, dc = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}[a]
            pos = (pos[0] + dr, pos[1] + dc)
            assert desc[pos] != HOLE


def test_frozen_lake_hole_terminates_without_reward():
    desc = np.array([[START, HOLE], [0, GOAL]], dtype=np.int8)
    env = make_env("FrozenLake")
    env.reset(seed=0)
    env.set_state(FrozenLakeState(desc=desc, player=(0, 0)))
    _, reward, terminated, truncated, info = env.step("<answer>Right</answer>")
    assert reward == 0.0 and terminated and not truncated and not info["success"]
    assert env.render() == "_X\n_G"


def test_frozen_lake_slippery_moves_follow_success_rate():
    desc = np.zeros((41, 41), dtype=np.int8)
    desc[0, 0], desc[-1, -1] = START, GOAL
    env = make_env("frozen_lake", size=4, is_slippery=True, max_steps=10_000)
    env.reset(seed=5)
    intended = 0
    for _ in range(3000):
        env.set_state(FrozenLakeState(desc=desc, player=(20, 20)))
        env.step("<answer>Down</answer>")
        intended += env.state.player == (21, 20)
    assert abs(intended / 3000 - 1 / 3) < 0.04
    # deterministic per seed
    runs = []
    for _ in range(2):
        env.reset(seed=11)
        runs.append([env.step("<answer>Right</answer>")[0] for _ in range(3) if not env.done])
    assert runs[0] == runs[1]


def test_solve_raises_for_unsolvable_state():
    level = parse_level("#####\n#P__#\n#_X_#\n#__O#\n#####")
    assert solve_actions(level) == ["Down", "Right", "Up", "Right", "Down"]
    stuck = parse_level("#####\n#X_P#\n#__O#\n#####")  # box in a corner can never move
    with pytest.raises(rl_envs.solvers.UnsolvableError):
        solve_actions(stuck)


def test_prompt_fields_and_render_modes(tmp_path):
    env = make_env("FrozenLake", render_save_dir=str(tmp_path))
    obs, _ = env.reset(seed=4)
    text = env.turn_prompt(obs, turn_idx=3, max_response_length=77)
    assert "Turn 3:" in text and obs in text and "10 actions left" in text and "77" in text
    image = env.render("rgb_array")
    assert image.shape == (4 * 16, 4 * 16, 3) and image.dtype == np.uint8
    env.step("<answer>Down</answer>")
    frames = sorted(p.name for p in tmp_path.iterdir())
    assert len(frames) == 2 and frames[0].endswith("step0000.png")
    with pytest.raises(ValueError, match="unknown field"):
        make_env("FrozenLake", turn_template="{observation} {score}")
    with pytest.raises(ValueError, match="render mode"):
        env.render("human")


def test_registry_rejects_duplicates_and_names_unknowns():
    with pytest.raises(ValueError, match="already registered"):
        rl_envs.register_env("sokoban", lambda **_: None)
    with pytest.raises(ValueError, match="already registered"):
        rl_envs.register_tag("SimpleSokoban", "sokoban")
    with pytest.raises(KeyError, match="NoSuchEnv"):
        make_env("NoSuchEnv")
    with pytest.raises(TypeError, match="bogus"):
        make_env("SimpleSokoban", bogus=1)
    assert set(rl_envs.TAGS) <= set(rl_envs.list_tags())
    assert isinstance(make_env("FrozenLake"), rl_envs.Env)


def test_a_builtin_name_is_refused_before_the_builtins_are_loaded():
    """In a fresh process (nothing has listed or built an env yet), registering a built-in's
    name must fail, not succeed and then break every later use of the built-ins (it did, when
    xdist happened to run the duplicate check first in a worker)."""
    code = (
        "import rl_envs\n"
        "for call in (lambda: rl_envs.register_env('sokoban', lambda **_: None),\n"
        "             lambda: rl_envs.register_tag('SimpleSokoban', 'sokoban')):\n"
        "    try:\n        call()\n    except ValueError as exc:\n        print(exc)\n"
        "print(type(rl_envs.make_env('SimpleSokoban')).__name__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "env name 'sokoban' is already registered",
        "env tag 'SimpleSokoban' is already registered",
        "SokobanEnv",
    ]


def test_import_needs_only_numpy():
    code = (
        "import sys, rl_envs, rl_envs.groups, rl_envs.rewards, rl_envs.sandbox, rl_envs.tasks;"
        "bad = [m for m in ('torch', 'PIL', 'pyarrow', 'math_verify', 'sympy') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
