"""Sokoban state and the forward move rule (shared by env, generator checks and solver)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WALL, FLOOR, TARGET = 0, 1, 2
# Codes of a rendered room (ROLL/gym-sokoban numbering, used by ``grid_lookup``).
BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = 3, 4, 5, 6

ACTIONS: dict[str, tuple[int, int]] = {
    "Up": (-1, 0),
    "Down": (1, 0),
    "Left": (0, -1),
    "Right": (0, 1),
}
ACTION_NAMES: tuple[str, ...] = ("Up", "Down", "Left", "Right")

Pos = tuple[int, int]


@dataclass(frozen=True)
class SokobanState:
    """A position. ``fixed`` is ``[H, W]`` int8 (WALL / FLOOR / TARGET); boxes and player move."""

    fixed: np.ndarray
    boxes: frozenset[Pos]
    player: Pos
    answer_format: str = "<answer>{action}</answer>"

    @property
    def targets(self) -> frozenset[Pos]:
        return frozenset((int(r), int(c)) for r, c in zip(*np.nonzero(self.fixed == TARGET)))

    def is_solved(self) -> bool:
        return all(self.fixed[b] == TARGET for b in self.boxes)

    def room_codes(self) -> np.ndarray:
        """``[H, W]`` int grid with codes 0..6 (wall, floor, target, box on target, box, player,
        player on target)."""
        codes = self.fixed.astype(np.int8).copy()
        for b in self.boxes:
            codes[b] = BOX_ON_TARGET if self.fixed[b] == TARGET else BOX
        codes[self.player] = PLAYER_ON_TARGET if self.fixed[self.player] == TARGET else PLAYER
        return codes


@dataclass(frozen=True)
class MoveOutcome:
    player: Pos
    boxes: frozenset[Pos]
    moved: bool
    pushed_onto_target: int  # +1 when a box entered a target
    pushed_off_target: int  # +1 when a box left a target


def move(fixed: np.ndarray, boxes: frozenset[Pos], player: Pos, action: str) -> MoveOutcome:
    """Apply one forward move: walk, or push one box; walls and double boxes block."""
    dr, dc = ACTIONS[action]
    nxt = (player[0] + dr, player[1] + dc)
    if fixed[nxt] == WALL:
        return MoveOutcome(player, boxes, False, 0, 0)
    if nxt not in boxes:
        return MoveOutcome(nxt, boxes, True, 0, 0)
    beyond = (nxt[0] + dr, nxt[1] + dc)
    if fixed[beyond] == WALL or beyond in boxes:
        return MoveOutcome(player, boxes, False, 0, 0)
    new_boxes = (boxes - {nxt}) | {beyond}
    onto = int(fixed[beyond] == TARGET)
    off = int(fixed[nxt] == TARGET)
    return MoveOutcome(nxt, frozenset(new_boxes), True, onto, off)


def parse_level(text: str, grid_lookup: dict[int, str] | None = None) -> SokobanState:
    """Build a state from rendered text (``#`` wall, ``_`` floor, ``O`` target, ``√`` box on
    target, ``X`` box, ``P`` player, ``S`` player on target by default)."""
    lookup = grid_lookup or {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}
    code_of = {symbol: code for code, symbol in lookup.items()}
    rows = [line.strip() for line in text.strip().splitlines()]
    if len({len(r) for r in rows}) != 1:
        raise ValueError("level rows must all have the same length")
    fixed = np.zeros((len(rows), len(rows[0])), dtype=np.int8)
    boxes: set[Pos] = set()
    player: Pos | None = None
    for r, row in enumerate(rows):
        for c, symbol in enumerate(row):
            if symbol not in code_of:
                raise ValueError(f"unknown symbol {symbol!r} at row {r}, column {c}")
            code = code_of[symbol]
            on_target = code in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET)
            fixed[r, c] = WALL if code == WALL else TARGET if on_target else FLOOR
            if code in (BOX, BOX_ON_TARGET):
                boxes.add((r, c))
            if code in (PLAYER, PLAYER_ON_TARGET):
                player = (r, c)
    if player is None:
        raise ValueError("level has no player")
    return SokobanState(fixed=fixed, boxes=frozenset(boxes), player=player)
