"""Where a replayed step's first non-finite value appears (`rl-replay --detect-anomaly`): the
recorded batch tensors holding NaN/inf, and the first module whose forward output is non-finite."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def _nonfinite(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_floating_point() and not bool(torch.isfinite(value.detach()).all())
    if isinstance(value, tuple | list):
        return any(_nonfinite(v) for v in value)
    if isinstance(value, dict):  # a transformers ModelOutput too
        return any(_nonfinite(v) for v in value.values())
    return False


def nonfinite_inputs(batch: dict[str, torch.Tensor]) -> dict[str, str]:
    """`{"batch": ...}` naming the recorded batch's tensors that hold NaN/inf (how many, and
    the first index), or {} when all are finite."""
    found = []
    for key in sorted(batch):
        t = batch[key]
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = (~torch.isfinite(t)).nonzero()
            found.append(f"{key} ({len(bad)} non-finite, first at {bad[0].tolist()})")
    return {"batch": "; ".join(found)} if found else {}


@contextmanager
def watch_nonfinite(model: torch.nn.Module, found: dict[str, str]) -> Iterator[None]:
    """Forward hooks on every module of `model`: the first whose output is non-finite is noted
    in `found` (`module`, `module_type`, `inputs`, `nonfinite_parameters`)."""

    def hook(name: str) -> Any:
        def check(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            if "module" in found or not _nonfinite(output):
                return
            bad = [n for n, p in module.named_parameters(recurse=False) if _nonfinite(p)]
            found.update(
                module=name or "<model>",
                module_type=type(module).__name__,
                inputs="non-finite" if _nonfinite(inputs) else "finite",
                nonfinite_parameters=", ".join(bad) or "none",
            )

        return check

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
