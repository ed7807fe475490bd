"""Blind baselines on a set of FrozenLake maps (non-slippery dynamics), for judging a policy.

`random_policy_success`: the expected share of maps solved by uniformly random moves (exact, by
propagating the position distribution). `best_fixed_sequence`: the one action sequence of at most
`max_steps` moves that solves the most maps when played blind on all of them (exhaustive search
with pruning, vectorised over maps). A policy that reads the map should beat both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rl_envs.frozen_lake.generator import ACTION_NAMES, GOAL, HOLE, FrozenLakeState, step_position


def _tables(states: Sequence[FrozenLakeState]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`next[m, cell, a]` cell after action a on map m, `kind[m, cell]` (0 ice, 1 hole, 2 goal),
    `start[m]`; cells are row-major over the largest map ([M, S, 4], [M, S], [M])."""
    if not states:
        raise ValueError("no maps to evaluate baselines on")
    size = max(max(s.desc.shape) for s in states)
    cells = size * size
    nxt = np.zeros((len(states), cells, len(ACTION_NAMES)), dtype=np.int64)
    kind = np.ones((len(states), cells), dtype=np.int8)  # cells off a smaller map: holes
    start = np.zeros(len(states), dtype=np.int64)
    for m, st in enumerate(states):
        rows, cols = st.desc.shape
        for r in range(rows):
            for c in range(cols):
                cell = r * size + c
                kind[m, cell] = 1 if st.desc[r, c] == HOLE else 2 if st.desc[r, c] == GOAL else 0
                for a, name in enumerate(ACTION_NAMES):
                    nr, nc = step_position(st.desc, (r, c), name)
                    nxt[m, cell, a] = nr * size + nc
        start[m] = st.player[0] * size + st.player[1]
    return nxt, kind, start


def random_policy_success(states: Sequence[FrozenLakeState], max_steps: int) -> float:
    """Expected share of maps a uniformly random mover reaches the goal on within `max_steps`."""
    nxt, kind, start = _tables(states)
    m, cells, actions = nxt.shape
    prob = np.zeros((m, cells))
    prob[np.arange(m), start] = 1.0
    solved = np.zeros(m)
    for _ in range(max_steps):
        moved = np.zeros_like(prob)
        for a in range(actions):
            np.add.at(moved, (np.arange(m)[:, None], nxt[:, :, a]), prob / actions)
        solved += np.where(kind == 2, moved, 0.0).sum(1)
        prob = np.where(kind == 0, moved, 0.0)  # goal and holes end the episode
    return float(solved.mean())


def best_fixed_sequence(
    states: Sequence[FrozenLakeState], max_steps: int
) -> tuple[tuple[str, ...], float]:
    """The action sequence (length <= `max_steps`) solving the largest share of maps, and it."""
    nxt, kind, start = _tables(states)
    rows = np.arange(len(states))
    best: list = [(), -1]

    def search(pos: np.ndarray, live: np.ndarray, solved: int, seq: tuple[str, ...]) -> None:
        if solved > best[1]:
            best[0], best[1] = seq, solved
        if len(seq) == max_steps or solved + int(live.sum()) <= best[1]:
            return
        for a, name in enumerate(ACTION_NAMES):
            moved = nxt[rows, pos, a]
            landed = kind[rows, moved]
            reached = live & (landed == 2)
            search(moved, live & (landed == 0), solved + int(reached.sum()), (*seq, name))

    search(start, kind[rows, start] == 0, int((kind[rows, start] == 2).sum()), ())
    return best[0], best[1] / len(states)
