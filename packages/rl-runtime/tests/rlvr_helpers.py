"""Prompts, a plan, a text scorer and an in-process cluster for the RLVR pipeline's tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rl_config.records import GenerationRequest, GenerationResult
from rl_config.schema import ExperimentConfig
from rl_envs.tasks.data import TaskRow
from rl_rollout.templates import get_template
from rl_runtime.pipelines.rlvr.compose import RlvrPlan, build_rlvr
from rl_runtime.pipelines.rlvr.eval import held_out_accuracy
from rl_runtime.pipelines.rlvr.rollout import GroupGenerator, rollout_batch
from rl_runtime.pipelines.rlvr.scoring import Scored, Scorer

SEED = 42


def _plan(train: list[str], val: str | None, **extra: Any) -> RlvrPlan:
    data: dict[str, Any] = {"template": "native", "file_name": train}
    if val is not None:
        data["eval_file_name"] = val
    cfg = {
        "pretrain": "tiny", "seed": SEED, "rollout_batch_size": 4,
        "num_return_sequences_in_group": 2, "val_batch_size": 5, "val_n_sample": 2,
        "val_greedy": True, "prompt_length": 48, "response_length": 8,
        "dynamic_sampling": {"enable": True, "max_num_gen_batches": 1},
        "actor_train": {"data_args": data},
        "actor_infer": {"generating_args": {"max_new_tokens": 8}}, **extra,
    }  # fmt: skip
    return build_rlvr(ExperimentConfig.model_validate(cfg))


def _lengths(tok, rows: Sequence[TaskRow]) -> list[int]:
    template = get_template("native", tok)
    return [len(tok(template.prefix(r.prompt), add_special_tokens=False)["input_ids"])
            for r in rows]  # fmt: skip


class TextScorer(Scorer):
    """Reward 1.0 for the response `1`, 0.0 otherwise (no sandbox)."""

    def __init__(self) -> None:  # no sandbox
        pass

    def score(self, rows, texts, lengths) -> list[Scored]:
        return [Scored(float(t == "1"), True, "ok") for t in texts]


class FakeCluster:
    """actor_infer on two fake engines: `answer(request, k)` is sample k's text; requests and
    phases are recorded."""

    def __init__(self, tok, answer) -> None:
        self.tok, self.answer = tok, answer
        self.workers = [0, 1]
        self.requests: list[GenerationRequest] = []
        self.phases: list[str] = []

    def __getitem__(self, role: str) -> FakeCluster:
        assert role == "actor_infer"
        return self

    def enter_phase(self, phase: str) -> None:
        self.phases.append(phase)

    def submit_each(self, method: str, args: list[tuple]) -> list[list[GenerationResult]]:
        assert method == "generate"
        return [[r for req in chunk for r in self._results(req)] for (chunk,) in args]

    def wait(self, refs: list, what: str) -> list:
        return refs

    def _results(self, req: GenerationRequest) -> list[GenerationResult]:
        self.requests.append(req)
        out = []
        for k in range(req.sampling.n):
            ids = self.tok(self.answer(req, k), add_special_tokens=False)["input_ids"]
            out.append(GenerationResult(request_id=req.request_id, prompt_ids=req.prompt_ids,
                                        output_ids=ids, output_log_probs=[0.0] * len(ids),
                                        finish_reason="stop", weight_version=0, sample_index=k))  # fmt: skip
        return out


def _sandboxed_step_and_eval(plan: RlvrPlan, prompts: Any, cluster: FakeCluster, tok) -> tuple:
    """Step 0's rollout and the held-out evaluation, scored by the plan's rewards in the real
    sandbox: `(RolloutBatch, held-out metrics)`."""
    scorer = Scorer(plan.rewards, plan.overlong, plan.response_length, allow_weak_isolation=True)
    try:
        generator = GroupGenerator(scorer, tok)
        batch = rollout_batch(cluster, generator, prompts, plan, seed=SEED, index=0)  # fmt: skip
        return batch, held_out_accuracy(cluster, generator, prompts, plan, SEED)
    finally:
        scorer.close()
