"""Episode-end scoring of agentic trajectories by model rewards (a judge, a reward model).

Each model domain (rl_runtime.compose.model_rewards.build_episode_rewards) scores the episodes
of its env tags once they ended, on its own role (rl_runtime.step.model_rewards.ModelScorer): the
question is the episode's first prompt, the response everything after it (the model's turns
and the env's answers), both decoded without special tokens. The score is added to the reward
of the episode's last turn (so it sits on that turn's last model token, `rewards [B, T]`, for a
critic's returns as for a group estimator) and to `episode_reward`. A score the model could not
give (timeout, worker error, unreadable verdict, non-finite score) marks the last turn's
reward as failed (`info["reward_failed"]`): the episode is screened out of training and counted
(rl_runtime.step.failures), never trained on with the env's reward alone. Failed episodes
(rl_runtime.step.failures) are not scored. One scoring at a time: asynchronous training scores
its rollouts on the producer thread while an evaluation scores on the trainer's, and a role that
shares devices sleeps after each scoring.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from rl_envs.rewards.manager import RewardInput
from rl_runtime.compose.model_rewards import ModelRewardPlan
from rl_runtime.step.failures import failure_kind
from rl_runtime.step.model_rewards import ModelScorer


class EpisodeScorer:
    """Adds each model domain's episode-end score to the trajectories of its tags (see module
    docstring); `tokenizer` decodes the episodes (the policy's)."""

    def __init__(self, cluster: Any, plans: Sequence[ModelRewardPlan], tokenizer: Any) -> None:
        self.scorers = [(p, ModelScorer(cluster, p)) for p in plans]
        self.tokenizer = tokenizer
        self._lock = threading.Lock()

    def __call__(self, trajectories: Sequence[Any], prefix: str = "reward") -> dict[str, float]:
        """Score `trajectories` in place; metrics per domain under `prefix/model/<domain>/`:
        `mean` of the scores given, `scored` and `failed` episode counts."""
        metrics: dict[str, float] = {}
        for plan, scorer in self.scorers:
            chosen = [t for t in trajectories
                      if t.tag in plan.tags and t.turns and failure_kind(t) is None]  # fmt: skip
            if not chosen:
                continue
            with self._lock:
                outputs = scorer([self._item(t, plan.domain) for t in chosen])
            given: list[float] = []
            for t, out in zip(chosen, outputs, strict=True):
                last = t.turns[-1]
                if out.ok:
                    last.reward += out.reward
                    t.episode_reward += out.reward
                    given.append(out.reward)
                else:
                    last.info = {**last.info, "reward_failed": True,
                                 "reward_error": f"rewards.{plan.domain}: {out.kind}: {out.error}"}  # fmt: skip
            key = f"{prefix}/model/{plan.domain}"
            metrics[f"{key}/scored"] = float(len(given))
            metrics[f"{key}/failed"] = float(len(chosen) - len(given))
            if given:
                metrics[f"{key}/mean"] = sum(given) / len(given)
        return metrics

    def _item(self, trajectory: Any, domain: str) -> RewardInput:
        ids, n = trajectory.token_ids, trajectory.prompt_length
        decode = self.tokenizer.decode
        return RewardInput(
            data_source=trajectory.tag,
            solution_str=decode(ids[n:], skip_special_tokens=True),
            ground_truth="",
            prompt=decode(ids[:n], skip_special_tokens=True),
            domain=domain,
        )
