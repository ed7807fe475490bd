"""Non-finite guard: a NaN/Inf loss or grad norm on ANY rank skips the optimizer step on EVERY rank.

The decision is all-reduced (max of a 0/1 flag) so ranks never diverge. Skips are counted; after
``max_consecutive`` skipped steps in a row training stops with :class:`NonFiniteTrainingError`.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


class NonFiniteTrainingError(RuntimeError):
    """Raised when too many optimizer steps in a row had a non-finite loss or gradient norm."""


def any_rank_true(flag: bool, device: torch.device | None = None) -> bool:
    """True if ``flag`` is True on any rank of the default process group (local flag otherwise)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device or torch.device("cpu"))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


class NonFiniteGuard:
    def __init__(self, max_consecutive: int = 3, role: str = "actor") -> None:
        self.max_consecutive = max_consecutive
        self.role = role
        self.consecutive = 0
        self.total_skipped = 0

    def should_skip(self, local_nonfinite: bool, device: torch.device | None = None) -> bool:
        """All-reduce the local flag; count and return whether this step is skipped everywhere."""
        skip = any_rank_true(local_nonfinite, device)
        self.record(skip)
        return skip

    def record(self, skipped: bool) -> None:
        if not skipped:
            self.consecutive = 0
            return
        self.consecutive += 1
        self.total_skipped += 1
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteTrainingError(
                f"{self.role}: {self.consecutive} optimizer steps in a row had a non-finite loss or "
                f"gradient norm (limit training_args.max_consecutive_nonfinite="
                f"{self.max_consecutive}); check the learning rate, the data and the loss inputs"
            )


def is_finite(value: float | torch.Tensor) -> bool:
    if isinstance(value, torch.Tensor):
        return bool(torch.isfinite(value).all().item())
    return math.isfinite(value)
