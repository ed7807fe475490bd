"""Breadth-first FrozenLake solver (shortest path on the non-slippery dynamics)."""

from __future__ import annotations

from collections import deque

from rl_envs.frozen_lake.generator import (
    ACTION_NAMES,
    GOAL,
    HOLE,
    FrozenLakeState,
    Pos,
    step_position,
)


def solve_frozen_lake(state: FrozenLakeState) -> list[str] | None:
    """Shortest list of action names from the player to the goal avoiding holes; None if none."""
    desc = state.desc
    start = state.player
    if desc[start] == GOAL:
        return []
    parents: dict[Pos, tuple[Pos, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        for name in ACTION_NAMES:
            nxt = step_position(desc, pos, name)
            if nxt in parents or desc[nxt] == HOLE:
                continue
            parents[nxt] = (pos, name)
            if desc[nxt] == GOAL:
                path: list[str] = []
                node = nxt
                while (link := parents[node]) is not None:
                    node, action = link
                    path.append(action)
                return path[::-1]
            queue.append(nxt)
    return None
