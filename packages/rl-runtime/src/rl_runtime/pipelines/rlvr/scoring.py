"""RLVR's rewards: a response scored by `rl_envs.rewards.router.RewardRouter` in a sandbox pool
(per-domain reward functions, `custom_reward_function`, model rewards' scorers), then DAPO's
overlong penalty when enabled; a failed call is counted, never trained on as a reward."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rl_envs.rewards.extras import EXTRA_SKIP_REASONS, ExtraNames, numeric_extras
from rl_envs.rewards.manager import RewardInput, overlong_penalty
from rl_envs.rewards.router import RewardRouter, RewardRouterSpec, make_reward_pool
from rl_envs.tasks.data import TaskRow
from rl_runtime.pipelines.rlvr.compose import OverlongPlan


@dataclass
class Scored:
    """One response's reward record: `reward` (the reward function's score plus the overlong
    `penalty`, <= 0, when DAPO's penalty is on), whether the call succeeded (`ok`, else its
    failure `kind`); `extras`: the numeric entries a succeeded call returned besides its score
    (verl's reward_extra_info, rl_envs.rewards.extras), `extras_skipped`: its entries left out,
    by reason."""

    reward: float
    ok: bool
    kind: str
    penalty: float = 0.0
    extras: dict[str, float] = field(default_factory=dict)
    extras_skipped: dict[str, int] = field(default_factory=dict)

    @property
    def score(self) -> float:
        """The reward function's own score: `reward` before the overlong penalty, which shapes
        the reward, not the answer's correctness nor how hard the prompt is."""
        return self.reward - self.penalty

    @property
    def correct(self) -> bool:
        """Solved: the call succeeded and the reward function scored it 1 or more (`score`: a
        right answer near the length limit is still right)."""
        return self.ok and self.score >= 1.0


class Scorer:
    """Rewards by domain in the sandbox, DAPO's overlong penalty added when enabled; a failed
    call scores 0.0 and says so (`Scored.ok`, its `kind`: never silently zero; the callers count
    them, rl_runtime.pipelines.rlvr.metrics.count_failures). Model domains (a judge, a reward model) are
    scored by `model_scorers` (rl_runtime.step.model_rewards). Thread-safe: asynchronous training scores
    rollout batches (producer thread) while evaluating."""

    def __init__(
        self,
        rewards: RewardRouterSpec,
        overlong: OverlongPlan,
        response_length: int,
        *,
        allow_weak_isolation: bool,
        model_scorers: Mapping[str, Any] | None = None,
    ) -> None:
        self.pool = make_reward_pool(2, allow_weak_isolation=allow_weak_isolation)
        try:
            self.router = RewardRouter(rewards, pool=self.pool, model_scorers=model_scorers)
        except BaseException:
            self.pool.close()
            raise
        self.overlong, self.response_length = overlong, response_length
        self._lock = threading.Lock()
        self._reported: set[tuple[str | None, str]] = set()  # (domain, kind) printed once
        self._reported_extras: set[tuple[str | None, str]] = set()  # (domain, skip reason)
        self._extra_names = ExtraNames()  # the run's extra names, bounded

    def score(
        self, rows: Sequence[TaskRow], texts: Sequence[str], lengths: Sequence[int]
    ) -> list[Scored]:
        """One `Scored` per response, in order; a succeeded call's extras checked
        (`numeric_extras`: a malformed extras dict loses its extras, never its score) and
        their names bounded over the run (`ExtraNames`: a reward that makes up new names
        cannot add metrics to every step's row)."""
        items = [
            RewardInput.from_row(r, t, response_length=n)
            for r, t, n in zip(rows, texts, lengths, strict=True)
        ]
        with self._lock:
            outputs = self.router.score(items)
            self._report_first_failures(items, outputs)
        scored = []
        for item, out in zip(items, outputs, strict=True):
            penalty = 0.0
            if self.overlong.enable:
                penalty = overlong_penalty(
                    item.response_length or 0,
                    max_resp_len=self.response_length,
                    buffer_len=self.overlong.buffer_length,
                    factor=self.overlong.penalty_factor,
                )
            extras = None
            if out.ok:
                with self._lock:  # the names and the reported set are shared between threads
                    extras = self._extra_names.admit(numeric_extras(out.extra))
                    self._report_skipped_extras(item.domain, extras.skipped)
            scored.append(Scored(out.reward + penalty, out.ok, out.kind, penalty,
                                 extras.values if extras else {},
                                 extras.skipped if extras else {}))  # fmt: skip
        return scored

    def _report_skipped_extras(self, domain: str | None, skipped: dict[str, int]) -> None:
        """Print the first skip of each (domain, reason): a reward's extra that never shows
        up as a metric would otherwise be a mystery. Not for text and other non-numbers
        (`not_number`, only counted): returning them is normal (verl's DAPO rule returns the
        predicted answer as `pred`), not a mistake to report on every run."""
        for reason in skipped:
            if reason == "not_number" or (domain, reason) in self._reported_extras:
                continue
            self._reported_extras.add((domain, reason))
            print(f"warning: reward extras skipped ({reason}, domain {domain}): "
                  f"{EXTRA_SKIP_REASONS[reason]}; further such skips are only counted "
                  f"(reward/extra_skipped/{reason})", flush=True)  # fmt: skip

    def _report_first_failures(self, items: Sequence[RewardInput], outputs: Sequence[Any]) -> None:
        """Print the first failed call of each (domain, kind) with its error: the metrics only
        count them (`reward/failures/<kind>`), and a reward function that raises on every
        response would otherwise train on with no word of why."""
        for item, out in zip(items, outputs, strict=True):
            key = (item.domain, out.kind)
            if out.ok or key in self._reported:
                continue
            self._reported.add(key)
            print(f"warning: reward call failed ({out.kind}, domain {item.domain}): "
                  f"{out.error or 'no message'}; further such failures are only counted "
                  f"(reward/failures/{out.kind})", flush=True)  # fmt: skip

    def close(self) -> None:
        self.pool.close()
