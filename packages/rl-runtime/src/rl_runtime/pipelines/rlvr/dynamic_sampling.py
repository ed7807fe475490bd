"""DAPO dynamic sampling (arXiv:2503.14476, §3.2) as a refill loop over prompt groups.

A group is the G responses to one prompt. A group whose rewards are all equal has zero advantage
under group-normalised estimators (GRPO, RLOO ...): it adds no policy gradient, only noise in the
batch size. `fill_groups` keeps drawing groups until `target` informative ones are collected or
the extra-round bound is reached; the caller trains on what it returns. `fill_quotas` does the
same with a quota per key (per reward domain, ROLL's `domain_interleave_probs`): each refill
asks every key for its own missing groups.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

G = TypeVar("G")
K = TypeVar("K")


@dataclass
class FillResult(Generic[G]):
    """`groups`: the kept groups (at most `target`); `rounds`: generation rounds run (1 = no
    refill); `dropped`: groups dropped for zero reward variance; `generated`: groups generated;
    `filled`: the batch reached `target`."""

    groups: list[G]
    rounds: int
    dropped: int
    generated: int
    filled: bool

    def metrics(self, prefix: str = "dynamic_sampling") -> dict[str, float]:
        return {
            f"{prefix}/rounds": float(self.rounds),
            f"{prefix}/dropped_groups": float(self.dropped),
            f"{prefix}/generated_groups": float(self.generated),
            f"{prefix}/kept_groups": float(len(self.groups)),
            f"{prefix}/filled": float(self.filled),
        }


def has_signal(rewards: Sequence[float], atol: float = 0.0) -> bool:
    """True when a group's rewards are not all equal (within `atol`)."""
    return bool(rewards) and (max(rewards) - min(rewards)) > atol


def fill_groups(
    draw: Callable[[int], list[G]],
    rewards_of: Callable[[G], Sequence[float]],
    target: int,
    *,
    enable: bool,
    max_extra_rounds: int | None,
) -> FillResult[G]:
    """Collect `target` groups: `draw(k)` generates and scores k new groups.

    Disabled: one round, every group kept. Enabled: rounds ask for the missing count only, drop
    groups without reward variance, and stop when full or after `max_extra_rounds` extra rounds
    (None: no bound). A batch that is still short is returned as it is (possibly empty).
    """
    return fill_quotas(lambda wanted: draw(wanted[None]), rewards_of, {None: target},
                       lambda _: None, enable=enable,
                       max_extra_rounds=max_extra_rounds)  # fmt: skip


def fill_quotas(
    draw: Callable[[dict[K, int]], list[G]],
    rewards_of: Callable[[G], Sequence[float]],
    quotas: Mapping[K, int],
    key_of: Callable[[G], K],
    *,
    enable: bool,
    max_extra_rounds: int | None,
) -> FillResult[G]:
    """`fill_groups` with a quota per key (a reward domain of `domain_interleave_probs`):
    `draw({key: k})` generates and scores k new groups of each key in one round; a refill asks
    each key for its own missing count, so the kept batch keeps every key's share (a refill
    by the total would hand the dropped groups of one key to the others). `target` is the sum
    of the quotas; `filled` means every key reached its quota."""
    target = sum(quotas.values())
    if target < 1:
        raise ValueError(f"target must be >= 1, got {target}")
    if max_extra_rounds is not None and max_extra_rounds < 0:
        raise ValueError(f"max_extra_rounds must be >= 0 or None, got {max_extra_rounds}")
    wanted = {key: n for key, n in quotas.items() if n > 0}
    if not enable:
        groups = draw(wanted)
        return FillResult(groups, 1, 0, len(groups), len(groups) >= target)
    kept: list[G] = []
    have: Counter[K] = Counter()
    rounds = dropped = generated = 0
    while wanted and (max_extra_rounds is None or rounds <= max_extra_rounds):
        fresh = draw(wanted)
        rounds += 1
        generated += len(fresh)
        for group in fresh:
            key = key_of(group)
            if not has_signal(rewards_of(group)):
                dropped += 1
            elif have[key] < quotas.get(key, 0):
                have[key] += 1
                kept.append(group)
        wanted = {key: n - have[key] for key, n in quotas.items() if n > have[key]}
    return FillResult(kept, rounds, dropped, generated, not wanted)
