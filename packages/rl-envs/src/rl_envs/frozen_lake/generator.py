"""FrozenLake maps: random ice/holes with a guaranteed path from start (top-left, or a random
cell) to goal (bottom-right, or a random cell), deterministic per seed."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

FROZEN, HOLE, START, GOAL = 0, 1, 2, 3
MOVES: dict[str, tuple[int, int]] = {
    "Left": (0, -1),
    "Down": (1, 0),
    "Right": (0, 1),
    "Up": (-1, 0),
}
ACTION_NAMES: tuple[str, ...] = ("Left", "Down", "Right", "Up")

Pos = tuple[int, int]


@dataclass(frozen=True)
class FrozenLakeState:
    """``desc`` is ``[N, N]`` int8 (FROZEN / HOLE / START / GOAL); ``player`` is (row, col)."""

    desc: np.ndarray
    player: Pos
    answer_format: str = "<answer>{action}</answer>"

    @property
    def start(self) -> Pos:
        r, c = np.argwhere(self.desc == START)[0]
        return int(r), int(c)

    @property
    def goal(self) -> Pos:
        r, c = np.argwhere(self.desc == GOAL)[0]
        return int(r), int(c)


def step_position(desc: np.ndarray, pos: Pos, action: str) -> Pos:
    """Where a move takes the player; the map edge blocks."""
    dr, dc = MOVES[action]
    r, c = pos[0] + dr, pos[1] + dc
    n_rows, n_cols = desc.shape
    if 0 <= r < n_rows and 0 <= c < n_cols:
        return r, c
    return pos


def path_length(desc: np.ndarray) -> int | None:
    """Moves on the shortest path from START to GOAL avoiding holes; None when there is none."""
    start = tuple(int(v) for v in np.argwhere(desc == START)[0])
    dist = {start: 0}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        if desc[pos] == GOAL:
            return dist[pos]
        for name in ACTION_NAMES:
            nxt = step_position(desc, pos, name)
            if nxt not in dist and desc[nxt] != HOLE:
                dist[nxt] = dist[pos] + 1
                queue.append(nxt)
    return None


def has_path(desc: np.ndarray) -> bool:
    return path_length(desc) is not None


def generate_frozen_lake(
    seed: int,
    *,
    size: int = 4,
    p: float = 0.8,
    random_start: bool = False,
    random_goal: bool = False,
    min_path_length: int = 1,
) -> np.ndarray:
    """A ``[size, size]`` map whose cells are frozen with probability ``p`` and that has a path.

    Start top-left and goal bottom-right, or (``random_start``/``random_goal``) a uniformly random
    cell each, distinct from one another; the shortest path takes at least ``min_path_length``
    moves.
    """
    if size < 2:
        raise ValueError(f"size must be >= 2, got {size}")
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p (frozen probability) must be in (0, 1], got {p}")
    if min_path_length < 1:
        raise ValueError(f"min_path_length must be >= 1, got {min_path_length}")
    rng = np.random.default_rng(seed)
    for _ in range(10_000):
        desc = np.where(rng.random((size, size)) < p, FROZEN, HOLE).astype(np.int8)
        start, goal = (0, 0), (size - 1, size - 1)
        if random_start or random_goal:
            a, b = (divmod(int(cell), size) for cell in rng.permutation(size * size)[:2])
            start, goal = (a if random_start else start), (b if random_goal else goal)
            if start == goal:
                continue
        desc[start] = START
        desc[goal] = GOAL
        length = path_length(desc)
        if length is not None and length >= min_path_length:
            return desc
    raise RuntimeError(
        f"no FrozenLake map with a path of >= {min_path_length} moves (size={size}, p={p})"
    )
