"""The recipe's one door to rl_envs: prompt rows from data files, the resumable sampler with
domain mixing, and sandboxed reward scoring (rl_envs.tasks.data, rl_envs.rewards.manager).

Rows: verl's parquet schema (`data_source`, `prompt` = chat messages, `reward_model.ground_truth`,
`extra_info`) or ROLL-style jsonl whose columns `data_args` names (`prompt`/`messages`,
`response`, `tag`); a malformed row is rejected with its row number, and a file with no valid row
is an error naming it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rl_envs.rewards.manager import DAPORewardManager, RewardInput, RewardManager
from rl_envs.sandbox.limits import SandboxLimits
from rl_envs.sandbox.pool import SandboxPool
from rl_envs.tasks.data import TaskRow, validate_records
from rl_runtime.compose.rlvr import DataPlan, OverlongPlan


def _read(path: str) -> list[Any]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.endswith(".jsonl"):
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        out: list[Any] = []
        for i, line in enumerate(lines):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    out.append({"__bad_json__": f"line {i + 1}: {exc}"})
        return out
    if path.endswith(".json"):
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of rows")
        return data
    raise ValueError(f"{path}: unsupported dataset format (use .parquet, .jsonl or .json)")


def _rename(record: Any, plan: DataPlan) -> Any:
    """ROLL's column names (data_args.prompt/messages/response/tag) -> the loader's."""
    if not isinstance(record, dict) or "__bad_json__" in record:
        return record
    out = dict(record)
    column = plan.messages_key or plan.prompt_key
    if column and column != "prompt" and column in out:
        out["prompt"] = out.pop(column)
    if "reward_model" not in out and "answer" not in out and plan.response_key in out:
        out["answer"] = out[plan.response_key]
    if "data_source" not in out and plan.tag_key in out:
        out["data_source"] = out[plan.tag_key]
    return out


def load_prompts(files: Sequence[str], plan: DataPlan) -> tuple[list[TaskRow], list[str]]:
    """All valid rows of `files` and one line per rejected row (`file: row N: field ...`)."""
    rows: list[TaskRow] = []
    rejected: list[str] = []
    for path in files:
        report = validate_records([_rename(r, plan) for r in _read(path)], source=path)
        if not report.rows:
            raise ValueError(f"{path}: no valid rows\n{report.summary()}")
        rejected += [f"{path}: {e}" for e in report.rejected]
        base = len(rows)
        rows += [TaskRow(base + i, r.prompt, r.ground_truth, r.data_source, r.extra_info)
                 for i, r in enumerate(report.rows)]  # fmt: skip
    return rows, rejected


class PromptSampler:
    """Row indices for each step: a seeded permutation per epoch per domain, walked in order.

    With `probs` (data_args.domain_interleave_probs: domain -> weight), each batch takes
    round(weight x k) rows of each domain (largest remainder); a domain not in `probs` is an
    error. Without it, one pool of all rows. `state()` / `load_state()` carry (epoch, position)
    per domain so a resumed run continues with the next unseen prompts.
    """

    def __init__(
        self, domains: Sequence[str], seed: int, probs: dict[str, float] | None = None
    ) -> None:
        self.seed = seed
        names = sorted(set(domains))
        if probs:
            unknown = sorted(set(probs) - set(names))
            if unknown:
                raise ValueError(
                    f"data_args.domain_interleave_probs names {unknown}, not in the data "
                    f"(domains: {names})"
                )
            names = [n for n in names if probs.get(n, 0) > 0]
        key = (lambda d: d) if probs else (lambda d: "all")
        self.pools: dict[str, list[int]] = {}
        for i, d in enumerate(domains):
            if not probs or d in names:
                self.pools.setdefault(key(d), []).append(i)
        total = sum(probs[n] for n in names) if probs else 1.0
        self.weights = {n: probs[n] / total for n in names} if probs else {"all": 1.0}
        self.pos = {n: [0, 0] for n in self.pools}  # epoch, position

    def _order(self, name: str, epoch: int) -> list[int]:
        pool = self.pools[name]
        salt = sum(map(ord, name))
        perm = np.random.default_rng([self.seed, epoch, salt]).permutation(len(pool))
        return [pool[i] for i in perm]

    def _take(self, name: str, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            epoch, position = self.pos[name]
            order = self._order(name, epoch)
            got = order[position : position + k - len(out)]
            out += got
            position += len(got)
            self.pos[name] = [epoch + 1, 0] if position >= len(order) else [epoch, position]
        return out

    def next(self, k: int) -> list[int]:
        shares = {n: w * k for n, w in self.weights.items()}
        counts = {n: int(s) for n, s in shares.items()}
        for n in sorted(shares, key=lambda n: counts[n] - shares[n])[: k - sum(counts.values())]:
            counts[n] += 1
        return [i for n in sorted(counts) for i in self._take(n, counts[n])]

    def state(self) -> dict[str, list[int]]:
        return {n: list(v) for n, v in self.pos.items()}

    def load_state(self, state: dict[str, list[int]]) -> None:
        unknown = sorted(set(state) - set(self.pos))
        if unknown:
            raise ValueError(f"sampler state names domains {unknown} this data does not have")
        self.pos.update({n: list(v) for n, v in state.items()})


@dataclass
class Scored:
    reward: float
    ok: bool
    kind: str


class Scorer:
    """Sandboxed rewards (verl's `default_compute_score` dispatch by data_source), with DAPO's
    overlong penalty when enabled; failures are counted, never silently zero."""

    def __init__(
        self, overlong: OverlongPlan, response_length: int, *, allow_weak_isolation: bool
    ) -> None:
        self.pool = SandboxPool(
            2,
            limits=SandboxLimits(timeout_s=10.0, allow_weak_isolation=allow_weak_isolation),
            preload=("rl_envs.rewards.graders",),
        )
        if overlong.enable:
            self.manager: RewardManager = DAPORewardManager(
                self.pool,
                max_resp_len=response_length,
                overlong_buffer_len=overlong.buffer_length,
                overlong_penalty_factor=overlong.penalty_factor,
            )
        else:
            self.manager = RewardManager(self.pool)

    def score(self, rows: Sequence[TaskRow], texts: Sequence[str], lengths: Sequence[int]):
        items = [
            RewardInput(r.data_source, t, r.ground_truth, r.extra_info, response_length=n)
            for r, t, n in zip(rows, texts, lengths, strict=True)
        ]
        return [Scored(o.reward, o.ok, o.kind) for o in self.manager.score(items)]

    def close(self) -> None:
        self.pool.close()
