"""Shared helpers for rl-algos tests: random masks with padding, prompts, multi-turn gaps."""

from __future__ import annotations

import pytest
import torch


def _make_mask(b: int, t: int, seed: int, layout: str) -> torch.Tensor:
    """``[B, T]`` bool response mask.

    layout: ``right`` (prompt, response, right padding), ``left`` (left padding, prompt, response),
    ``multiturn`` (several response segments separated by env tokens).  Row 0 is always empty.
    """
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(b, t, dtype=torch.bool)
    for row in range(1, b):
        prompt = int(torch.randint(1, max(2, t // 3), (1,), generator=g))
        length = int(torch.randint(1, t - prompt + 1, (1,), generator=g))
        if layout == "right":
            mask[row, prompt : prompt + length] = True
        elif layout == "left":
            mask[row, t - length :] = True
        elif layout == "multiturn":
            pos = prompt
            while pos < t:
                seg = int(torch.randint(1, 5, (1,), generator=g))
                mask[row, pos : pos + seg] = True
                pos += seg + int(torch.randint(1, 4, (1,), generator=g))
        else:
            raise ValueError(layout)
    return mask


@pytest.fixture(params=["right", "left", "multiturn"])
def layout(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def make_mask():
    """The ``_make_mask(b, t, seed, layout)`` factory."""
    return _make_mask
