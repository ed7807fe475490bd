"""FrozenLake maps: random ice/holes with a guaranteed path from start (top-left) to goal
(bottom-right), deterministic per seed."""

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


def has_path(desc: np.ndarray) -> bool:
    start = tuple(int(v) for v in np.argwhere(desc == START)[0])
    seen = {start}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        if desc[pos] == GOAL:
            return True
        for name in ACTION_NAMES:
            nxt = step_position(desc, pos, name)
            if nxt not in seen and desc[nxt] != HOLE:
                seen.add(nxt)
                queue.append(nxt)
    return False


def generate_frozen_lake(seed: int, *, size: int = 4, p: float = 0.8) -> np.ndarray:
    """A ``[size, size]`` map whose cells are frozen with probability ``p`` and that has a path."""
    if size < 2:
        raise ValueError(f"size must be >= 2, got {size}")
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p (frozen probability) must be in (0, 1], got {p}")
    rng = np.random.default_rng(seed)
    for _ in range(10_000):
        desc = np.where(rng.random((size, size)) < p, FROZEN, HOLE).astype(np.int8)
        desc[0, 0] = START
        desc[-1, -1] = GOAL
        if has_path(desc):
            return desc
    raise RuntimeError(f"no FrozenLake map with a path (size={size}, p={p})")
