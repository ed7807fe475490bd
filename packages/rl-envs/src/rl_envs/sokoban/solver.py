"""Breadth-first Sokoban solver: optimal number of moves, used in tests and for demonstrations."""

from __future__ import annotations

from collections import deque

from rl_envs.sokoban.state import ACTION_NAMES, TARGET, Pos, SokobanState, move


def solve_sokoban(state: SokobanState, *, max_states: int = 2_000_000) -> list[str] | None:
    """Shortest list of action names that solves ``state``; None if unsolvable within the budget.

    Raises ``RuntimeError`` when more than ``max_states`` positions would be explored.
    """
    fixed = state.fixed
    start = (state.player, state.boxes)
    if state.is_solved():
        return []
    parents: dict[tuple[Pos, frozenset[Pos]], tuple[tuple[Pos, frozenset[Pos]], str] | None] = {
        start: None
    }
    queue = deque([start])
    while queue:
        current = queue.popleft()
        player, boxes = current
        for name in ACTION_NAMES:
            outcome = move(fixed, boxes, player, name)
            if not outcome.moved:
                continue
            key = (outcome.player, outcome.boxes)
            if key in parents:
                continue
            parents[key] = (current, name)
            if all(fixed[b] == TARGET for b in outcome.boxes):
                path: list[str] = []
                node: tuple[Pos, frozenset[Pos]] = key
                while (link := parents[node]) is not None:
                    node, action = link
                    path.append(action)
                return path[::-1]
            if len(parents) > max_states:
                raise RuntimeError(f"Sokoban BFS explored more than {max_states} states")
            queue.append(key)
    return None
