"""Sokoban rooms that are solvable by construction.

1. Carve a room: a random walk of floor inside a walled ``dim_room`` rectangle.
2. Place ``num_boxes`` targets and the player on floor; boxes start ON their targets (solved).
3. Reverse play: walk the player for up to ``search_depth`` moves, PULLING an adjacent box along
   when possible. Every reverse move undoes a legal forward move, so the position reached is
   solvable. Several walks are tried and the position with the highest score (box displacement x
   number of pull segments) is kept; a position with every box on a target is never returned.
4. Move the player to a random cell it can walk to without pushing (walking is reversible, so
   the level stays solvable and the first push is not given away).
"""

from __future__ import annotations

import numpy as np

from rl_envs.sokoban.state import ACTION_NAMES, ACTIONS, FLOOR, TARGET, WALL, Pos, SokobanState


class GenerationError(RuntimeError):
    """No level could be made (room too small for the number of boxes)."""


def _carve_room(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    fixed = np.full((height, width), WALL, dtype=np.int8)
    interior = (height - 2) * (width - 2)
    want = max(int(interior * 0.6), 4)
    r = int(rng.integers(1, height - 1))
    c = int(rng.integers(1, width - 1))
    direction = ACTIONS[ACTION_NAMES[int(rng.integers(4))]]
    carved = 0
    for _ in range(interior * 20):
        if fixed[r, c] == WALL:
            fixed[r, c] = FLOOR
            carved += 1
            if carved >= want:
                break
        if rng.random() < 0.35:
            direction = ACTIONS[ACTION_NAMES[int(rng.integers(4))]]
        nr, nc = r + direction[0], c + direction[1]
        if 1 <= nr < height - 1 and 1 <= nc < width - 1:
            r, c = nr, nc
    return fixed


def _reverse_walk(
    rng: np.random.Generator,
    fixed: np.ndarray,
    targets: list[Pos],
    player: Pos,
    depth: int,
) -> tuple[float, frozenset[Pos], Pos]:
    """One reverse-play walk; returns the best (score, boxes, player) it visits."""
    boxes = set(targets)
    origin = {t: t for t in targets}  # current box position -> the target it started on
    segments = 0  # how often the pulled box changed
    last_pulled: Pos | None = None
    best: tuple[float, frozenset[Pos], Pos] = (0.0, frozenset(boxes), player)
    for _ in range(depth):
        name = ACTION_NAMES[int(rng.integers(4))]
        dr, dc = ACTIONS[name]
        nxt = (player[0] + dr, player[1] + dc)
        if fixed[nxt] == WALL or nxt in boxes:
            continue
        behind = (player[0] - dr, player[1] - dc)
        if behind in boxes and rng.random() < 0.8:
            boxes.discard(behind)
            boxes.add(player)
            origin[player] = origin.pop(behind)
            if origin[player] != last_pulled:
                segments += 1
                last_pulled = origin[player]
        player = nxt
        if all(fixed[b] == TARGET for b in boxes):
            continue
        displacement = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in origin.items())
        score = float(displacement * segments)
        if score > best[0]:
            best = (score, frozenset(boxes), player)
    return best


def _reachable(fixed: np.ndarray, boxes: frozenset[Pos], start: Pos) -> list[Pos]:
    seen = {start}
    stack = [start]
    while stack:
        r, c = stack.pop()
        for dr, dc in ACTIONS.values():
            nxt = (r + dr, c + dc)
            if nxt not in seen and fixed[nxt] != WALL and nxt not in boxes:
                seen.add(nxt)
                stack.append(nxt)
    return sorted(seen)


def generate_sokoban(
    seed: int,
    *,
    dim_room: tuple[int, int] = (6, 6),
    num_boxes: int = 1,
    search_depth: int = 30,
    num_walks: int = 16,
    max_attempts: int = 200,
) -> SokobanState:
    """A solvable, unsolved level, the same for the same arguments."""
    height, width = dim_room
    if height < 4 or width < 4:
        raise ValueError(f"dim_room must be at least (4, 4), got {dim_room}")
    if num_boxes < 1:
        raise ValueError(f"num_boxes must be >= 1, got {num_boxes}")
    if search_depth < 1:
        raise ValueError(f"search_depth must be >= 1, got {search_depth}")
    rng = np.random.default_rng(seed)
    for _ in range(max_attempts):
        fixed = _carve_room(rng, height, width)
        floor = [(int(r), int(c)) for r, c in zip(*np.nonzero(fixed == FLOOR))]
        if len(floor) < num_boxes + 2:
            continue
        order = rng.permutation(len(floor))
        targets = [floor[i] for i in order[:num_boxes]]
        player = floor[order[num_boxes]]
        for t in targets:
            fixed[t] = TARGET
        best = (0.0, frozenset(targets), player)
        for _ in range(num_walks):
            candidate = _reverse_walk(rng, fixed, targets, player, search_depth)
            if candidate[0] > best[0]:
                best = candidate
        if best[0] > 0:
            cells = _reachable(fixed, best[1], best[2])
            player = cells[int(rng.integers(len(cells)))]
            return SokobanState(fixed=fixed, boxes=best[1], player=player)
    raise GenerationError(
        f"no Sokoban level after {max_attempts} rooms (dim_room={dim_room}, num_boxes={num_boxes})"
    )
