"""Model rewards on their own roles: the reward model's scores are a direct forward of the same
model, a judge's verdicts go through the engine protocol and its rule, timeouts and unreadable
verdicts are counted failures, and the extra role is placed (and slept when it shares devices)
by device_mapping. In-process workers (`--no-ray`'s), tiny models built here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rl_config.records import SamplingParams
from rl_envs.rewards import RewardInput
from rl_runtime.cluster.placement import plan_placement
from rl_runtime.compose.model_rewards import ModelRewardPlan
from rl_runtime.step.model_rewards import ModelScorer, question_of


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


def _episode(tok, tag: str, i: int, reward: float = -0.1, failed: bool = False):
    """A two-turn episode of `tag`: prompt, then model and env tokens; env rewards on turns."""
    from rl_config.records import Trajectory, Turn

    prompt = tok(f"Move to the goal {i}.", add_special_tokens=False)["input_ids"]
    act1, env1, act2 = (tok(x, add_special_tokens=False)["input_ids"]
                        for x in (" left", " You moved.", f" right {i}"))  # fmt: skip
    ids = [*prompt, *act1, *env1, *act2]
    n, a, e = len(prompt), len(act1), len(env1)
    mask = [False] * n + [True] * a + [False] * e + [True] * len(act2)
    turns = [Turn(turn_idx=0, start=n, end=n + a, reward=reward),
             Turn(turn_idx=1, start=n + a + e, end=len(ids), reward=reward)]  # fmt: skip
    return Trajectory(traj_id=f"{tag}{i}", group_id=tag, tag=tag, env_seed=i, token_ids=ids,
                      prompt_length=n, response_mask=mask, rollout_log_probs=[0.0] * len(ids),
                      turns=turns, episode_reward=2 * reward, failed=failed)  # fmt: skip


def test_episode_end_scores_add_to_the_last_turn_and_failures_are_screened(models):
    """Agentic episode-end scoring: the judge's yes (1.0) is added to the last turn's reward and
    the episode's reward of its tag's episodes only (another tag's and failed episodes, an env
    grader's failure included, are not scored); the reward model's score is its forward of (first prompt, the rest) decoded; an
    unreadable verdict fails the episode's reward, which screening then drops and counts."""
    from transformers import AutoTokenizer

    from rl_runtime.pipelines.agentic.episode_rewards import EpisodeScorer
    from rl_runtime.step.failures import screen_failures

    tok = AutoTokenizer.from_pretrained(models["rm"])
    yes = _plan("llm_judge", models["yes"], tags=("A",))
    rm = _plan("reward_model", models["rm"], domain="r", role="reward_r", tags=("B",))
    maybe = _plan("llm_judge", models["maybe"], domain="m", role="reward_m", tags=("C",))
    cluster = _start([yes, rm, maybe])
    try:
        eps = [_episode(tok, "A", 0), _episode(tok, "A", 1, failed=True), _episode(tok, "B", 2),
               _episode(tok, "C", 3), _episode(tok, "D", 4)]  # fmt: skip
        graded_badly = _episode(tok, "A", 5)  # its env's grader failed: screened anyway
        graded_badly.turns[0].info = {"reward_failed": True}
        eps.append(graded_badly)
        metrics = EpisodeScorer(cluster, [yes, rm, maybe], tok)(eps)
        a, a_failed, b, c, d, _ = eps
        assert [t.reward for t in a.turns] == pytest.approx([-0.1, 0.9])
        assert a.episode_reward == pytest.approx(0.8)
        for t in (a_failed, d, graded_badly):  # not scored
            assert [x.reward for x in t.turns] == [-0.1, -0.1] and t.episode_reward == -0.2
        worker = cluster["reward_r"].workers[0]._obj
        text = tok.decode(b.token_ids, skip_special_tokens=True)
        prompt = tok.decode(b.token_ids[: b.prompt_length], skip_special_tokens=True)
        direct = worker.score([[{"role": "user", "content": prompt},
                                {"role": "assistant", "content": text[len(prompt):]}]], 1)[0]  # fmt: skip
        assert b.turns[-1].reward == pytest.approx(-0.1 + direct, abs=1e-5)
        assert metrics["reward/model/r/mean"] == pytest.approx(direct, abs=1e-5)
        assert c.turns[-1].reward == -0.1 and c.turns[-1].info["reward_failed"]
        assert "rewards.m: unreadable_verdict" in c.turns[-1].info["reward_error"]
        assert metrics["reward/model/d/mean"] == 1.0 and metrics["reward/model/d/scored"] == 1
        assert metrics["reward/model/m/failed"] == 1 and "reward/model/m/mean" not in metrics
        screened = screen_failures(eps, 1.0)
        assert c not in screened.kept and screened.metrics["failures/reward_failures"] == 2
    finally:
        cluster.shutdown()


def test_episode_reward_domains_take_env_tags_and_one_model_per_tag():
    from rl_config.loading import load_app_config
    from rl_runtime.compose.model_rewards import build_episode_rewards

    config = (
        Path(__file__).resolve().parents[3] / "apps" / "agentic" / "configs" / "cpu_default.yaml"
    )
    base = ["rewards.j.reward_fn=reward_model", "rewards.j.model_args.model_name_or_path=/m",
            "rewards.j.device_mapping=[0]"]  # fmt: skip
    cfg, _ = load_app_config(config, base, section="agentic_app")
    (plan,) = build_episode_rewards(cfg, ["A", "B"])
    assert plan.tags == ("A", "B") and plan.role == "reward_j"  # unset: every env tag
    cfg, _ = load_app_config(config, [*base, "rewards.j.tag_included=[Z]"], section="agentic_app")
    with pytest.raises(ValueError, match=r"rewards.j.tag_included: \['Z'\] are no env's tag"):
        build_episode_rewards(cfg, ["A"])
    second = ["rewards.k.reward_fn=reward_model", "rewards.k.model_args.model_name_or_path=/m",
              "rewards.k.device_mapping=[0]", "rewards.k.tag_included=[A]"]  # fmt: skip
    cfg, _ = load_app_config(config, [*base, *second], section="agentic_app")
    with pytest.raises(ValueError, match="env tag 'A' is scored by rewards.j already"):
        build_episode_rewards(cfg, ["A"])
