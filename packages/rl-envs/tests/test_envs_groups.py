"""Env groups (ROLL env manager semantics) and concurrent stepping with failures."""

from __future__ import annotations

import threading
import time

import pytest

from rl_envs import make_env
from rl_envs.groups import ConcurrentStepper, EnvGroupManager


def test_groups_share_seed_and_tag_and_follow_partition():
    manager = EnvGroupManager(tags=["SimpleSokoban", "FrozenLake"], num_env_groups=5, group_size=3,
                              num_groups_partition=[2, 3], seed=7)  # fmt: skip
    items = manager.assignments(epoch=0)
    assert len(items) == 15 == manager.num_envs
    assert [a.tag for a in items[::3]] == ["SimpleSokoban"] * 2 + ["FrozenLake"] * 3
    for g in range(5):
        members = [a for a in items if a.group_id == g]
        assert len({(a.tag, a.seed) for a in members}) == 1 and len(members) == 3
    assert len({a.seed for a in items}) == 5
    again = EnvGroupManager(tags=["SimpleSokoban", "FrozenLake"], num_env_groups=5, group_size=3,
                            num_groups_partition=[2, 3], seed=7)  # fmt: skip
    assert again.assignments(0) == items
    assert {a.seed for a in manager.assignments(1)}.isdisjoint({a.seed for a in items})


def test_group_partition_validation_and_default_split():
    with pytest.raises(ValueError, match="sums to"):
        EnvGroupManager(tags=["SimpleSokoban"], num_env_groups=4, num_groups_partition=[3])
    with pytest.raises(ValueError, match="entries"):
        EnvGroupManager(
            tags=["SimpleSokoban", "FrozenLake"], num_env_groups=4, num_groups_partition=[4]
        )
    manager = EnvGroupManager(
        tags=["SimpleSokoban", "LargerSokoban", "FrozenLake"], num_env_groups=7
    )
    assert manager.num_groups_partition == [3, 2, 2]


def test_from_roll_config_and_worker_partition():
    config = {"format_penalty": -0.15, "max_env_num_per_worker": 4, "num_env_groups": 8,
              "group_size": 1, "tags": ["SimpleSokoban"], "num_groups_partition": [8]}  # fmt: skip
    manager = EnvGroupManager.from_config(config)
    chunks = manager.worker_partition(epoch=0)
    assert [len(c) for c in chunks] == [4, 4]
    slots = manager.slots(0)
    assert slots[0].env.format_penalty == -0.15
    assert manager.slots(1)[0].env is slots[0].env  # envs are reused across epochs


def test_group_members_see_identical_observations():
    manager = EnvGroupManager(tags=["LargerSokoban"], num_env_groups=2, group_size=4, seed=1)
    stepper = ConcurrentStepper(max_workers=4, timeout_s=10)
    slots = manager.slots(0)
    outcomes = stepper.reset_all(slots)
    observations = [outcomes[s.assignment.env_id].value[0] for s in slots]
    assert len(set(observations[:4])) == 1 and len(set(observations[4:])) == 1
    assert observations[0] != observations[4]
    stepper.close()


class _BadEnv:
    max_steps = 5
    format_penalty = 0.0

    def __init__(self, mode: str, release: threading.Event):
        self.mode = mode
        self.release = release

    def reset(self, seed=None):
        return "obs", {}

    def step(self, action_text):
        if self.mode == "raise":
            raise RuntimeError("env exploded")
        if self.mode == "hang":
            self.release.wait(30)
        return (
            "obs",
            1.0,
            True,
            False,
            {"action_is_valid": True, "format_ok": True, "success": True},
        )


def test_raising_or_hanging_env_fails_its_slot_and_never_stalls_others():
    release = threading.Event()
    modes = {0: "ok", 1: "raise", 2: "hang", 3: "ok"}

    created: list[_BadEnv] = []

    def factory(tag, **config):
        env = _BadEnv(modes[len(created)], release)
        created.append(env)
        return env

    manager = EnvGroupManager(tags=["X"], num_env_groups=4, group_size=1, env_factory=factory)
    slots = manager.slots(0)
    stepper = ConcurrentStepper(max_workers=4, timeout_s=0.5)
    stepper.reset_all(slots)
    start = time.monotonic()
    outcomes = stepper.step_all(slots, {s.assignment.env_id: "<answer>Up</answer>" for s in slots})
    assert time.monotonic() - start < 2.0
    assert [outcomes[i].ok for i in range(4)] == [True, False, False, True]
    assert "env exploded" in outcomes[1].error and "exceeded" in outcomes[2].error
    assert [s.failed for s in slots] == [False, True, True, False]
    assert stepper.stats["timeouts"] == 1 and stepper.stats["errors"] == 1
    # the hung thread is abandoned: later calls still run at full speed
    more = stepper.map({i: (lambda: 42) for i in range(6)}, timeout_s=2.0)
    assert all(o.ok and o.value == 42 for o in more.values())
    release.set()
    stepper.close()


def test_real_envs_step_concurrently_match_sequential():
    envs = [make_env("SimpleSokoban") for _ in range(6)]
    sequential = []
    for i, env in enumerate(envs):
        env.reset(seed=i)
        sequential.append(env.step("<answer>Left</answer>")[:4])
    manager = EnvGroupManager(tags=["SimpleSokoban"], num_env_groups=6, seed=0)
    slots = manager.slots(0)
    for i, slot in enumerate(slots):
        object.__setattr__(
            slot, "assignment", slot.assignment.__class__(i, i, 0, "SimpleSokoban", i)
        )
    stepper = ConcurrentStepper(max_workers=3)
    stepper.reset_all(slots)
    outcomes = stepper.step_all(slots, {i: "<answer>Left</answer>" for i in range(6)})
    assert [outcomes[i].value[:4] for i in range(6)] == sequential
    stepper.close()
