"""Off-policy token-level distillation's step (rl_runtime.pipelines.distill.kd.kd_step) on real
in-process train workers (tiny models, rl-train's hf backend) behind a minimal context: the
teacher's top-k reaches actor_train, which trains on the configured divergence; the logged
forward/reverse KL fall step after step; rows follow the seeded epoch order; distill_on_prompt
trains every token but the first."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from rl_runtime.cluster.train_worker import TrainWorker
from rl_runtime.pipelines.distill.kd import kd_step, trained_mask
from rl_runtime.pipelines.distill.off_policy import OffPolicyOptions
from rl_runtime.step.sft_data import SFTExample


class _Group:
    def __init__(self, worker: TrainWorker) -> None:
        self.workers = [worker]

    def submit_each(self, method: str, args: list) -> list:
        return [getattr(w, method)(*a) for w, a in zip(self.workers, args, strict=True)]

    def wait(self, results: list, _method: str) -> list:
        return results

    def call_all(self, method: str, *args):
        return [getattr(w, method)(*args) for w in self.workers]


class _Cluster(dict):
    def enter_phase(self, *a, **k) -> dict:
        return {}


@contextmanager
def _phase(name: str) -> Iterator[None]:
    yield


class _Ctx:
    def __init__(self, groups: dict[str, _Group]) -> None:
        self.groups, self.step, self.syncs = groups, 0, 0
        self.cluster = _Cluster(groups)
        self.components = SimpleNamespace(seed=3)
        self.timer = SimpleNamespace(phase=_phase, metrics=lambda: {})

    def train(self, role: str, tensors: dict, loss: str) -> dict:
        return self.groups[role].workers[0].train_step(tensors, loss)

    def sync_weights(self) -> dict:
        self.syncs += 1
        return {"sync/weight_version": float(self.syncs)}


def _worker(path: str, role: str) -> TrainWorker:
    args = {"per_device_train_batch_size": 8, "infer_batch_size": 4, "learning_rate": 1e-2}
    return TrainWorker(rank=0, world_size=1, dist_env={}, role=role, model_path=path,
                       strategy_name="hf_infer", training_args=args)  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[str, str]:
    from rl_rollout.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("kd")
    return (str(build_tiny_model(out / "student", seed=0)),
            str(build_tiny_model(out / "teacher", seed=1)))  # fmt: skip


def _rows(n: int) -> list[SFTExample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(3, 900, (6 + i % 3,), generator=g).tolist()
        out.append(SFTExample(tuple(ids), tuple(j >= 3 for j in range(len(ids)))))
    return out


@pytest.mark.parametrize("objective", ["forward_kl", "reverse_kl"])
def test_kd_steps_move_the_student_toward_the_teacher(models, objective):
    student, teacher = models
    ctx = _Ctx({"actor_train": _Group(_worker(student, "actor")),
                "teacher_t": _Group(_worker(teacher, "reference"))})  # fmt: skip
    options = OffPolicyOptions(source="teacher", loss="kd", batch_size=8, logits_topk=32,
                               kd_objective=objective, distill_loss_weight=1.0)  # fmt: skip
    ctx.groups["actor_train"].call_all("set_distill_loss", options.kd_config())
    rows = _rows(8)
    seen = []
    for step in range(6):
        ctx.step = step
        m = kd_step(ctx, rows, options, "teacher_t", pad_token_id=0)
        seen.append(m)
        assert m["distill/rows"] == 8 and m["distill/tokens"] == sum(r.trained_tokens for r in rows)
        assert m["distill/kd_loss"] == pytest.approx(m[f"distill/{objective}"], rel=1e-4)
    assert seen[-1]["distill/forward_kl"] < 0.7 * seen[0]["distill/forward_kl"]
    assert seen[-1]["distill/reverse_kl"] < 0.7 * seen[0]["distill/reverse_kl"]
    assert ctx.syncs == 6


def test_distill_on_prompt_trains_every_token_but_the_first():
    t = {"attention_mask": torch.tensor([[1, 1, 1, 0]]),
         "response_mask": torch.tensor([[False, False, True, False]])}  # fmt: skip
    assert trained_mask(t, False).tolist() == [[False, False, True, False]]
    assert trained_mask(t, True).tolist() == [[False, True, True, False]]
