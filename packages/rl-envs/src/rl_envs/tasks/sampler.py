"""Resumable prompt sampling with ROLL's multi-domain mixing.

Offers:

* ``EpochSampler(size, seed, shuffle=True)``: row indices, a fresh permutation per epoch (from
  ``(seed, epoch)``), ``take(n)`` continues across epochs; ``state_dict()`` /
  ``load_state_dict()`` hold ``epoch`` and ``position``, so a resumed run continues with the next
  unseen rows of the interrupted epoch.
* ``check_domain_probs(probs)``: ``ValueError`` unless the probabilities are finite, >= 0, and
  sum to more than 0 and at most 1 (below 1: the last domain takes the remainder, as in ROLL);
  ``remainder_note(probs)`` says so ('' when they sum to 1).
* ``PromptSampler(rows, seed, domain_interleave_probs=None)``: ``next_batch(n)`` -> rows. With
  ``domain_interleave_probs`` (ROLL ``data_args``) each batch holds ``int(p * n)`` rows of each
  domain in the table's order, the last domain the remainder (ROLL's ``domain_batch_size``);
  each domain has its own ``EpochSampler``. ``draw(n, domain)`` takes more rows of one domain
  (dynamic-sampling refills). Deterministic given the seed. ``state_dict()`` holds every
  domain's position.
"""

from __future__ import annotations

import logging
import zlib
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from rl_envs.tasks.data import TaskRow

logger = logging.getLogger(__name__)
ALL = "__all__"
_SUM_TOLERANCE = 1e-6


class EpochSampler:
    """Indices ``0..size-1``, shuffled per epoch by ``(seed, epoch)``."""

    def __init__(self, size: int, seed: int, *, shuffle: bool = True) -> None:
        if size < 1:
            raise ValueError(f"cannot sample from {size} rows")
        self.size = size
        self.seed = int(seed)
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.size)
        return np.random.default_rng([self.seed, epoch]).permutation(self.size)

    def take(self, n: int) -> list[int]:
        """The next ``n`` indices; an epoch's end rolls into the next, reshuffled, epoch."""
        out: list[int] = []
        while len(out) < n:
            if self.position == self.size:
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            step = min(n - len(out), self.size - self.position)
            out += self._order[self.position : self.position + step].tolist()
            self.position += step
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "size": self.size, "shuffle": self.shuffle}  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore; the seed, size and shuffle must match (else the order would differ)."""
        for key in ("seed", "size", "shuffle"):
            if state.get(key) != getattr(self, key):
                raise ValueError(
                    f"sampler state has {key}={state.get(key)!r} but this sampler has "
                    f"{getattr(self, key)!r} (dataset or seed changed since the checkpoint)"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.size:
            raise ValueError(f"sampler state out of range: epoch {epoch}, position {position}")
        self.epoch, self.position = epoch, position
        self._order = self._permutation(epoch)


def _domain_seed(seed: int, domain: str) -> int:
    return (int(seed) * 1_000_003 + zlib.crc32(domain.encode())) % (1 << 63)


def domain_quotas(probs: Mapping[str, float], n: int) -> dict[str, int]:
    """Rows per domain in a batch of ``n``: ``int(p * n)``, the last domain the remainder."""
    quotas: dict[str, int] = {}
    names = list(probs)
    for i, name in enumerate(names):
        quotas[name] = n - sum(quotas.values()) if i == len(names) - 1 else int(probs[name] * n)
    return quotas


def check_domain_probs(probs: Mapping[str, Any]) -> float:
    """``ValueError`` unless every probability is a finite number >= 0 and their sum is above 0
    and at most 1; returns the sum. Below 1 the last domain takes the remainder of each batch
    (``domain_quotas``, as ROLL's ``domain_batch_size`` does): ``remainder_note`` says so."""
    bad = {d: p for d, p in probs.items()
           if isinstance(p, bool) or not (isinstance(p, int | float) and 0 <= p < float("inf"))}  # fmt: skip
    if bad:
        raise ValueError(f"domain_interleave_probs must be finite numbers >= 0: {bad}")
    total = float(sum(probs.values()))
    if total <= 0:
        raise ValueError(f"domain_interleave_probs must not all be 0: {dict(probs)}")
    if total > 1.0 + _SUM_TOLERANCE:
        raise ValueError(f"domain_interleave_probs must sum to at most 1, got {total:g}")
    return total


def remainder_note(probs: Mapping[str, float]) -> str:
    """What a batch holds when ``probs`` (checked by ``check_domain_probs``) sum to less than 1:
    the last domain takes the remainder, not its own probability (ROLL does the same, silently);
    '' when they sum to 1."""
    total = float(sum(probs.values()))
    if total >= 1.0 - _SUM_TOLERANCE:
        return ""
    *_, last = probs
    share = 1.0 - (total - probs[last])
    return (
        f"domain_interleave_probs sums to {total:g}, not 1: the last domain {last!r} takes the "
        f"remainder of each batch ({share:g} of it, not {probs[last]:g}), as ROLL does"
    )


class PromptSampler:
    """Batches of rows, mixed by domain when ``domain_interleave_probs`` is given."""

    def __init__(
        self,
        rows: list[TaskRow],
        seed: int,
        domain_interleave_probs: Mapping[str, float] | None = None,
        *,
        shuffle: bool = True,
    ) -> None:
        if not rows:
            raise ValueError("no rows to sample")
        self.probs = dict(domain_interleave_probs or {})
        if self.probs:
            check_domain_probs(self.probs)
            if note := remainder_note(self.probs):
                logger.warning(note)
            groups = {d: [r for r in rows if r.domain == d] for d in self.probs}
            empty = [d for d, g in groups.items() if not g]
            if empty:
                raise ValueError(
                    f"domain_interleave_probs names domains with no rows: {empty}; rows have "
                    f"{dict(Counter(r.domain for r in rows))}"
                )
            self.unsampled = Counter(r.domain for r in rows if r.domain not in self.probs)
            if self.unsampled:
                logger.warning("rows of domains not in domain_interleave_probs are never "
                               "sampled: %s", dict(self.unsampled))  # fmt: skip
        else:
            groups = {ALL: list(rows)}
            self.unsampled = Counter()
        self.groups = groups
        self.samplers = {
            d: EpochSampler(len(g), _domain_seed(seed, d), shuffle=shuffle)
            for d, g in groups.items()
        }

    def draw(self, n: int, domain: str | None = None) -> list[TaskRow]:
        """The next ``n`` rows of ``domain`` (None without domain mixing)."""
        key = ALL if domain is None and not self.probs else domain
        if key not in self.samplers:
            raise KeyError(f"no domain {domain!r} in this sampler ({list(self.samplers)})")
        group = self.groups[key]
        return [group[i] for i in self.samplers[key].take(n)]

    def next_batch(self, n: int) -> list[TaskRow]:
        """``n`` rows: by domain quotas in the table's order, or the next ``n`` rows."""
        if not self.probs:
            return self.draw(n)
        return [row for d, k in domain_quotas(self.probs, n).items() for row in self.draw(k, d)]

    @property
    def epoch(self) -> int:
        """Epochs completed by the slowest domain."""
        return min(s.epoch for s in self.samplers.values())

    def state_dict(self) -> dict[str, Any]:
        return {"domains": {d: s.state_dict() for d, s in self.samplers.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        saved = dict(state.get("domains", {}))
        if set(saved) != set(self.samplers):
            raise ValueError(
                f"sampler state has domains {sorted(saved)}, this sampler {sorted(self.samplers)}"
            )
        for domain, sampler in self.samplers.items():
            sampler.load_state_dict(saved[domain])
