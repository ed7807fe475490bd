"""The driver side of model rewards: one scorer per model domain for rl-envs' reward router
(`RewardRouter(model_scorers=...)`), which calls the domain's role (rl_runtime.cluster.reward_workers).

A scoring: the responses are split over the role's workers; when the role shares its devices
with another role the workers wake up first and sleep after; each worker's answer is awaited
until the domain's `timeout_s`. A response whose worker timed out (`timeout`) or raised
(`model_error`), a judge verdict the domain's rule cannot read (`unreadable_verdict`) and a
non-finite reward-model score (`not_finite`) are failures of that kind (`RewardOutput.ok`
False): counted and screened out of training like a rule reward's, never a 0 trained on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from rl_envs.rewards.judge import judge_messages, parse_verdict
from rl_envs.rewards.manager import RewardInput, RewardOutput
from rl_runtime.cluster.rpc import RpcTimeoutError
from rl_runtime.compose.model_rewards import ModelRewardPlan
from rl_runtime.step.collate import shard_rows


def question_of(prompt: Any) -> str:
    """The question a row's prompt asks: the text, or its chat's last user message."""
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content", "") for m in prompt or () if m.get("role") == "user"]
    return str(users[-1]) if users else ""


def model_scorers(
    cluster: Any, plans: Sequence[ModelRewardPlan]
) -> dict[str, Callable[[list[RewardInput]], list[RewardOutput]]]:
    """`{domain: scorer}` of every model domain, for the reward router."""
    return {p.domain: ModelScorer(cluster, p) for p in plans}


class ModelScorer:
    """Scores one model domain's items on its role (see module docstring)."""

    def __init__(self, cluster: Any, plan: ModelRewardPlan) -> None:
        self.plan = plan
        self.group = cluster[plan.role]
        self.shared = bool(cluster.plan.roles[plan.role].colocated_with)

    def __call__(self, items: list[RewardInput]) -> list[RewardOutput]:
        if not items:
            return []
        p = self.plan
        if p.kind == "llm_judge":
            chats = [judge_messages(p.judge_prompt, question_of(i.prompt), i.solution_str,
                                    i.ground_truth) for i in items]  # fmt: skip
            args: tuple = (p.sampling, p.batch_size)
            method = "judge"
        else:
            chats = [[{"role": "user", "content": question_of(i.prompt)},
                      {"role": "assistant", "content": i.solution_str}] for i in items]  # fmt: skip
            args, method = (p.batch_size,), "score"
        answers = self._call(method, chats, args)
        if p.kind == "llm_judge":
            return [self._verdict(a) for a in answers]
        return self._scores(answers)

    def _call(self, method: str, chats: list, args: tuple) -> list[Any]:
        """Per chat: the worker's answer, or a failed `RewardOutput` when its worker failed."""
        group, n = self.group, len(self.group.workers)
        shards = shard_rows(chats, n)
        if self.shared:
            group.call_all("wake_up")
        try:
            timeout = self.plan.timeout_s
            refs: list[Any] = []
            for rank, shard in enumerate(shards):
                try:  # a local worker runs it here (for `timeout` at most), Ray returns a ref
                    refs.append(group.submit_to(rank, method, shard, *args, timeout=timeout))
                except Exception as exc:
                    refs.append(exc)
            deadline = time.monotonic() + timeout
            out: list[Any] = []
            for ref, shard in zip(refs, shards, strict=True):
                try:
                    if isinstance(ref, Exception):
                        raise ref
                    left = max(1e-3, deadline - time.monotonic())  # the calls run at once
                    answers = group.wait([ref], method, timeout=left)[0]
                except RpcTimeoutError as exc:
                    answers = [RewardOutput(0.0, False, "timeout", str(exc))] * len(shard)
                except Exception as exc:  # a worker's error fails its responses, counted
                    error = f"{self.plan.role}.{method}: {exc}"
                    answers = [RewardOutput(0.0, False, "model_error", error)] * len(shard)
                out += list(answers)
            return out
        finally:
            if self.shared:
                group.call_all("sleep", 1)

    def _verdict(self, answer: Any) -> RewardOutput:
        if isinstance(answer, RewardOutput):
            return answer
        value = parse_verdict(answer, self.plan.verdict)
        if value is None:
            error = f"judge verdict {answer[:200]!r} is not readable as {self.plan.verdict}"
            return RewardOutput(0.0, False, "unreadable_verdict", error)
        return RewardOutput(value, True)

    def _scores(self, answers: list[Any]) -> list[RewardOutput]:
        out = [
            a if isinstance(a, RewardOutput)
            else RewardOutput(float(a), True) if math.isfinite(a)
            else RewardOutput(0.0, False, "not_finite", f"reward model score {a}")
            for a in answers
        ]  # fmt: skip
        if self.plan.normalize:
            ok = [o.reward for o in out if o.ok]
            if len(ok) > 1:
                mean = sum(ok) / len(ok)
                std = math.sqrt(sum((x - mean) ** 2 for x in ok) / len(ok))
                for o in out:
                    if o.ok:
                        o.reward = (o.reward - mean) / (std + 1e-6)
        return out
