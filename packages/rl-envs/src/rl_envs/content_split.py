"""Held-out by content: which split (train or val) a puzzle instance belongs to.

An env's `content_key()` describes what makes an instance the same puzzle (for FrozenLake: the
layout, start and goal). A stable hash of that key places the instance in `"val"` with
probability `val_fraction`, else in `"train"`; an env configured with `layout_split` redraws
until its instance falls in that split, so training and validation never share a puzzle, whatever
seeds they are given.
"""

from __future__ import annotations

import hashlib

SPLITS = ("train", "val")


def content_bucket(key: bytes) -> float:
    """A number in [0, 1) that depends only on `key` (blake2b, not Python's salted hash)."""
    digest = hashlib.blake2b(key, digest_size=8, person=b"rl-split").digest()
    return int.from_bytes(digest, "little") / 2**64


def content_split(key: bytes, val_fraction: float) -> str:
    """`"val"` for a `val_fraction` share of all keys, `"train"` for the rest."""
    return "val" if content_bucket(key) < val_fraction else "train"


def check_split_options(layout_split: str | None, val_fraction: float) -> None:
    if layout_split is not None and layout_split not in SPLITS:
        raise ValueError(f"layout_split must be one of {SPLITS} or unset, got {layout_split!r}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
