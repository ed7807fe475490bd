import pytest

from rl_runtime.state.seeds import member_seed
from rl_runtime.step.envs import GroupSeededEnv, env_assignments, make_envs


def _assign(**kw):
    base = dict(
        tags=["FrozenLake", "SimpleSokoban"],
        num_env_groups=4,
        group_size=2,
        num_groups_partition=[3, 1],
        base_seed=1,
        epoch=0,
    )
    base.update(kw)
    return env_assignments(**base)


def test_groups_share_tag_and_seed_and_are_deterministic():
    a = _assign()
    assert len(a) == 8
    assert [t for _g, t, _s in a] == ["FrozenLake"] * 6 + ["SimpleSokoban"] * 2
    for i in range(0, 8, 2):
        assert a[i] == a[i + 1]
    assert a == _assign()
    assert a != _assign(epoch=1)
    assert len({s for _g, _t, s in a}) == 4


def test_val_ignores_epoch_and_num_episodes_cycles_groups():
    assert _assign(split="val", epoch=0) == _assign(split="val", epoch=5)
    many = _assign(num_episodes=16)
    assert len(many) == 16 and len({g for g, _t, _s in many}) == 8
    with pytest.raises(ValueError, match="multiple of group_size"):
        _assign(num_episodes=7)


def test_partition_must_match_tags():
    with pytest.raises(ValueError, match="num_groups_partition"):
        _assign(num_groups_partition=[1, 1])


def test_group_members_play_the_same_env_but_sample_differently():
    a = env_assignments(
        tags=["FrozenLake"],
        num_env_groups=1,
        group_size=2,
        num_groups_partition=None,
        base_seed=3,
        epoch=0,
    )
    envs = make_envs(a, {})
    (e0, s0, g0, _), (e1, s1, g1, _) = envs
    assert isinstance(e0, GroupSeededEnv) and g0 == g1 and s0 != s1
    assert s0 == member_seed(a[0][2], 0)
    obs0, _ = e0.reset(seed=s0)
    obs1, _ = e1.reset(seed=s1)
    assert obs0 == obs1  # the wrapper pins the env seed
    assert e0.max_steps == e1.max_steps  # other attributes pass through


def test_frames_are_rendered_only_by_env_types_that_render(tmp_path):
    """`render_save_dir` went to every env; a text task (countdown, tool_use) has no frames and
    its constructor refused the option, so a run with `render_val_envs` on one died."""
    specs = {"T": {"env_type": "tool_use", "config": {}},
             "F": {"env_type": "frozen_lake", "config": {"size": 3}}}  # fmt: skip
    built = make_envs([("g0", "T", 1), ("g1", "F", 2)], specs, render_save_dir=str(tmp_path))
    (tools, _, _, _), (lake, _, _, _) = built
    assert tools.reset()[0] and lake.render_save_dir == str(tmp_path)
