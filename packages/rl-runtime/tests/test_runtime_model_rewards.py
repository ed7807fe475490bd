"""Model rewards on their own roles: the reward model's scores are a direct forward of the same
model, a judge's verdicts go through the engine protocol and its rule, timeouts and unreadable
verdicts are counted failures, and the extra role is placed (and slept when it shares devices)
by device_mapping. In-process workers (`--no-ray`'s), tiny models built here."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rl_config.records import SamplingParams
from rl_envs.rewards import RewardInput
from rl_runtime.cluster.placement import plan_placement
from rl_runtime.pipelines.rlvr.model_reward_plan import ModelRewardPlan
from rl_runtime.pipelines.rlvr.model_rewards import ModelScorer, question_of


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from rl_rollout.tiny_reward_models import build_scripted_judge, build_tiny_reward_model

    root = tmp_path_factory.mktemp("reward_models")
    return {
        "rm": str(build_tiny_reward_model(root / "rm", seed=0)),
        "yes": str(build_scripted_judge(root / "yes", "yes")),
        "maybe": str(build_scripted_judge(root / "maybe", "maybe")),
    }


CHATS = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4, since 2+2=4"}],
    [{"role": "user", "content": "max of 3 8 1"}, {"role": "assistant", "content": "8"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a much longer answer x y z"}],
]  # fmt: skip


def test_reward_model_scores_equal_a_direct_forward_in_any_batch(models):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rl_runtime.cluster.reward_workers import RewardModelWorker

    worker = RewardModelWorker(rank=0, world_size=1, dist_env={}, model_path=models["rm"])
    batched, single = worker.score(CHATS, 3), worker.score(CHATS, 1)
    tok = AutoTokenizer.from_pretrained(models["rm"])
    model = AutoModelForSequenceClassification.from_pretrained(models["rm"]).eval()
    direct = []
    for chat in CHATS:  # the chat as the policy saw it: generation prompt, then the response
        text = tok.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True)
        ids = tok(text + chat[1]["content"], add_special_tokens=False, return_tensors="pt")
        with torch.no_grad():
            direct.append(float(model(input_ids=ids["input_ids"]).logits[0, 0]))
    assert batched == pytest.approx(direct, abs=1e-5) and single == pytest.approx(direct, abs=1e-5)
    assert len(set(round(x, 4) for x in direct)) == 3  # the scores tell the chats apart
    assert not any(p.requires_grad for p in worker.model.parameters())


def test_a_causal_lm_is_refused_as_a_reward_model(models, tmp_path):
    from rl_rollout.tiny_model import default_tiny_model_dir
    from rl_runtime.cluster.reward_workers import RewardModelWorker

    with pytest.raises(ValueError, match="not a sequence-classification model"):
        RewardModelWorker(
            rank=0, world_size=1, dist_env={}, model_path=str(default_tiny_model_dir())
        )


def _plan(kind: str, path: str, devices=(0,), **kw) -> ModelRewardPlan:
    base: dict[str, Any] = dict(domain="d", kind=kind, role="reward_d", model_path=path, dtype="float32",
                device_mapping=tuple(devices), strategy_name="hf_infer", strategy_config={},
                template="native", batch_size=2, timeout_s=120.0)  # fmt: skip
    if kind == "llm_judge":
        base.update(sampling=SamplingParams(temperature=0.8, max_new_tokens=6, seed=1),
                    judge_prompt="Q: {question}\nA: {response}\nRef: {reference}", verdict="yes_no")  # fmt: skip
    base.update(kw)
    return ModelRewardPlan(**base)


def _start(plans, num_devices=1):
    from rl_runtime.cluster.cluster import Cluster
    from rl_runtime.cluster.reward_workers import reward_role_spec

    specs = [reward_role_spec(p.role_plan(), p.model_path, 0) for p in plans]
    return Cluster.start(specs, num_devices=num_devices, use_ray=False, rpc_timeout=120)


def _items(n: int) -> list[RewardInput]:
    return [RewardInput("src", f"answer {i}", str(i), {}, prompt=[{"role": "user", "content": f"q{i}"}])
            for i in range(n)]  # fmt: skip


def test_judge_verdicts_rule_timeouts_and_sleep_when_sharing_devices(models):
    """Two model roles on one device (they share it: each wakes for its scoring and sleeps
    after); the scripted judge says yes (read as 1.0), the one that says maybe is an unreadable
    verdict, a call past its timeout fails its responses as `timeout`: all counted failures."""
    yes = _plan("llm_judge", models["yes"])
    maybe = _plan("llm_judge", models["maybe"], domain="m", role="reward_m")
    cluster = _start([yes, maybe])
    try:
        out = ModelScorer(cluster, yes)(_items(3))
        assert [(o.reward, o.ok) for o in out] == [(1.0, True)] * 3
        engine = cluster["reward_d"].workers[0]._obj.engine
        assert engine._asleep == 1  # shared devices: asleep between scorings
        bad = ModelScorer(cluster, maybe)(_items(2))
        assert [(o.ok, o.kind) for o in bad] == [(False, "unreadable_verdict")] * 2
        assert "'maybe' is not readable as yes_no" in bad[0].error
        slow = ModelScorer(cluster, _plan("llm_judge", models["yes"], timeout_s=1e-4))
        late = slow(_items(2))
        assert [(o.ok, o.kind) for o in late] == [(False, "timeout")] * 2
    finally:
        cluster.shutdown()


def test_reward_model_scorer_normalises_and_alone_it_stays_awake(models):
    plan = _plan("reward_model", models["rm"], normalize=True)
    cluster = _start([plan])
    try:
        out = ModelScorer(cluster, plan)(_items(4))
        scores = torch.tensor([o.reward for o in out])
        assert all(o.ok for o in out)
        assert abs(float(scores.mean())) < 1e-5 and float(
            scores.std(unbiased=False)
        ) == pytest.approx(1.0, abs=1e-4)
        assert ModelScorer(cluster, plan).shared is False
    finally:
        cluster.shutdown()


@pytest.mark.parametrize(("devices", "shared"), [((0,), True), ((1,), False)])
def test_the_reward_role_is_placed_on_one_or_two_devices(devices, shared):
    plan = plan_placement(
        {"actor_train": [0], "actor_infer": [0], "reward_d": list(devices)}, num_devices=2
    )
    role = plan.roles["reward_d"]
    assert role.devices == devices and bool(role.colocated_with) == shared
    assert ("reward_d" in plan.roles["actor_infer"].colocated_with) == shared


def test_question_of_a_text_or_chat_prompt():
    assert question_of("plain") == "plain"
    assert question_of([{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
                        {"role": "assistant", "content": "a"}, {"role": "user", "content": "u2"}]) == "u2"  # fmt: skip
