"""rl_runtime.compose: KL, generation, estimator, schedule, attention and shared-prompt keys
reach the component that uses them; keys nothing reads are refused or warned by name."""

from __future__ import annotations

import pytest
import torch
from compose_helpers import BASE, _components, _merge

from rl_config.errors import ConfigError
from rl_config.records import Trajectory, Turn
from rl_config.schema import ExperimentConfig
from rl_runtime.compose import compose
from rl_runtime.step.advantages import compute_advantages, update_kl_controller
from rl_runtime.step.collate import collate_trajectories
from rl_train.args import LogprobSampling


def _traj(tid: str, group: str, reward: float, n_turns: int = 1) -> Trajectory:
    ids, mask, turns = [1, 2], [False, False], []
    for k in range(n_turns):
        start = len(ids)
        ids += [10 + k, 11 + k]
        mask += [True, True]
        turns.append(Turn(turn_idx=k, start=start, end=len(ids), reward=reward / n_turns))
        ids += [7 + (k if reward > 0 else 0)]
        mask += [False]
    return Trajectory(
        traj_id=tid,
        group_id=group,
        tag="FL",
        env_seed=0,
        token_ids=ids,
        prompt_length=2,
        response_mask=mask,
        rollout_log_probs=[0.0] * len(ids),
        turns=turns,
        episode_reward=reward,
        success=reward > 0,
    )


def _batch(n_turns: int = 1):
    trajs = [_traj("a", "g", 1.0, n_turns), _traj("b", "g", 0.0, n_turns)]
    return collate_trajectories(trajs, pad_token_id=0)


def test_kl_penalty_kind_and_add_token_level_kl():
    batch = _batch()
    mask = batch.tensors["response_mask"]
    lp = torch.zeros(mask.shape)
    ref = torch.full(mask.shape, -1.0)  # log ratio 1 on every token
    kl = {"init_kl_coef": 0.5, "add_token_level_kl": True}
    for kind, per_token in (("k1", 1.0), ("mse", 0.5)):
        c = _components({**kl, "kl_penalty": kind, "reward_normalization": {"method": "identity"}})
        coef = c.kl.build().value if c.kl.in_reward else 0.0
        adv = c.advantage
        out = compute_advantages(batch, adv, log_probs=lp, ref_log_probs=ref, kl_coef=coef)
        assert float(out["kl"][mask].mean()) == pytest.approx(per_token)
    off = _components({"init_kl_coef": 0.5})
    assert not off.kl.in_reward  # init_kl_coef alone adds no reward KL (ROLL semantics)
    assert any("add_token_level_kl" in w for w in off.warnings)


def test_adaptive_kl_controller_is_built_and_moves():
    c = _components({"init_kl_coef": 0.2, "add_token_level_kl": True, "target_kl": 0.01})
    ctl = c.kl.build()
    assert type(ctl).__name__ == "AdaptiveKLController"
    batch = _batch()
    mask = batch.tensors["response_mask"]
    out = compute_advantages(
        batch,
        c.advantage,
        log_probs=torch.zeros(mask.shape),
        ref_log_probs=torch.full(mask.shape, -1.0),
        kl_coef=ctl.value,
    )
    metrics = update_kl_controller(ctl, out, mask)
    assert metrics["train/kl_coef"] > 0.2  # KL 1 >> target 0.01: the coefficient grows
    fixed = _components({"init_kl_coef": 0.2, "adaptive_kl_ctrl": False, "target_kl": 0.01})
    assert type(fixed.kl.build()).__name__ == "FixedKLController"


def test_do_sample_false_is_greedy_and_generation_options_reach_sampling():
    gen = {"do_sample": False, "repetition_penalty": 1.3, "stop_strings": ["</answer>"]}
    c = _components({"actor_infer": {"generating_args": gen}})
    s = c.sampling("train", epoch=3)
    assert (s.temperature, s.top_p, s.top_k) == (0.0, 1.0, -1)
    assert s.repetition_penalty == 1.3 and s.stop == ["</answer>"]
    sampled = _components().sampling("train", epoch=3)
    assert sampled.temperature == 1.0 and sampled.seed == s.seed


def test_gigpo_weights_and_gamma_come_from_the_config():
    c = _components(
        {
            "adv_estimator": "gigpo",
            "episode_reward_weight": 0.0,
            "step_reward_weight": 3.0,
            "step_reward_gamma": 0.5,
            "reward_normalization": {"method": "identity"},
        }
    )
    a = c.advantage
    assert (a.gigpo_episode_weight, a.gigpo_step_weight, a.gigpo_gamma) == (0.0, 3.0, 0.5)
    out = compute_advantages(_batch(n_turns=2), a)
    full = compute_advantages(_batch(n_turns=2), _components({"adv_estimator": "gigpo"}).advantage)
    assert not torch.allclose(out["advantages"], full["advantages"])


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (
            {"reference": {"model_args": {"adapter_name_or_path": "lora/"}}},
            "adapter_name_or_path",
        ),
        ({"dynamic_sampling": {"enable": True}}, "dynamic_sampling.enable"),
        ({"overlong_penalty": {"enable": True}}, "overlong_penalty.enable"),
        ({"async": {"max_staleness": 1, "max_inflight_samples": 8}}, "async.max_inflight_samples"),
        ({"sft_loss_coef": 0.1}, "sft_loss_coef"),
    ],
)
def test_unsupported_keys_are_refused_by_name(extra, key):
    cfg = ExperimentConfig.model_validate(_merge(BASE, extra))  # valid ROLL config ...
    assert any(key in w for w in cfg.config_warnings())  # ... flagged by the check
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose(cfg)  # ... and refused before anything starts


def test_ignored_keys_warn_by_name():
    cfg = ExperimentConfig.model_validate(_merge(BASE, {"val_batch_size": 64}))
    assert any(w.startswith("val_batch_size=64 has no effect") for w in cfg.config_warnings())


def test_cosine_with_min_lr_schedules_down_to_the_floor():
    from rl_train.optim import lr_multiplier

    args = {"lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr_rate": 0.1}}
    t = _components({"actor_train": {"training_args": args}}).role("actor_train").training_args
    assert t.lr_scheduler_type == "cosine_with_min_lr" and t.min_lr_ratio == 0.1
    assert lr_multiplier(t.max_steps, t) == pytest.approx(0.1)
    assert lr_multiplier(0, t) == pytest.approx(1.0)


def test_fa2_falls_back_with_a_warning_naming_the_key():
    extra = {"actor_train": {"model_args": {"attn_implementation": "fa2", "dtype": "bf16"}}}
    cpu = _components(extra)
    assert cpu.role("actor_train").model_args.attn_implementation == "sdpa"
    assert any("actor_train.model_args.attn_implementation='fa2'" in w for w in cpu.warnings)
    cuda = _components(extra, device_kind="cuda", flash_attn_available=True)
    assert cuda.role("actor_train").model_args.attn_implementation == "flash_attention_2"
    # CUDA without the flash-attn package: PyTorch's own varlen flash kernel
    no_flash = _components(extra, device_kind="cuda", flash_attn_available=False)
    assert no_flash.role("actor_train").model_args.attn_implementation == "rl_varlen"
    assert any("flash-attn is not available on cuda" in w for w in no_flash.warnings)


def test_grouping_state_is_rolls_alias_of_traj_group_id():
    c = _components({"reward_normalization": {"grouping": "state"}})
    assert c.advantage.grouping == "traj_group_id"


def test_every_registered_estimator_is_nameable_in_the_schema():
    from typing import get_args

    from rl_algos.advantages import list_estimators
    from rl_config.schema.algorithm import AdvEstimatorName

    assert set(get_args(AdvEstimatorName)) == set(list_estimators())


def test_optimizer_steps_plan_the_lr_schedule():
    # 4 samples / (2 per micro-batch x 1 accumulation) = 2 optimizer steps per pipeline step
    c = _components({"max_steps": 10})
    assert c.role("actor_train").training_args.max_steps == 20
    assert c.sizes["optimizer_steps_total"] == 20


def test_share_prompt_forward_reaches_actor_and_reference_training_args():
    on = {"share_prompt_forward": True}
    kl = {"use_kl_loss": True, "kl_loss_coef": 0.1}  # a reference role
    components = _components({"actor_train": on, "reference": on, **kl})
    assert components.role("actor_train").training_args.share_prompt_forward
    assert components.role("reference").training_args.share_prompt_forward
    off = _components(kl)
    assert not off.role("actor_train").training_args.share_prompt_forward
    assert not off.role("reference").training_args.share_prompt_forward


@pytest.mark.parametrize(
    ("gen", "expected"),
    [
        ({"temperature": 0.7}, LogprobSampling(0.7)),
        ({"temperature": 0.7, "top_k": 100, "top_p": 0.99}, LogprobSampling(0.7, 100, 0.99)),
        ({"top_k": 0, "top_p": 1.0}, LogprobSampling()),
        ({"top_k": -1, "top_p": 0.5}, LogprobSampling(top_p=0.5)),
        ({"temperature": 0.7, "top_k": 5, "top_p": 0.9, "do_sample": False}, LogprobSampling()),
        ({"temperature": 0.0, "top_k": 5}, LogprobSampling()),
        ({}, LogprobSampling()),
    ],
    ids=["sampled", "truncated", "off", "top-p-only", "greedy", "temperature-0", "default"],
)
def test_the_trainers_log_probs_are_of_the_sampling_distribution(gen, expected):
    """The actor's and the reference's log-probs are those of the distribution the rollout samples
    from (temperature, top-k, top-p: the engine records its log-probs of it too); `top_k <= 0`
    and `top_p = 1` are off, greedy rollouts the raw model's."""
    kl = {"use_kl_loss": True, "kl_loss_coef": 0.1}  # a reference role
    c = _components({"actor_infer": {"generating_args": gen}, **kl})
    assert c.role("actor_train").training_args.logprob_sampling == expected
    assert c.role("reference").training_args.logprob_sampling == expected


@pytest.mark.parametrize(
    ("gen", "warns"),
    [
        ({"temperature": 0.7}, True),
        ({"top_k": 100}, True),
        ({"top_p": 0.99}, True),
        ({"temperature": 1.0}, False),
        ({"top_k": 100, "do_sample": False}, False),
    ],
    ids=["temperature", "top-k", "top-p", "raw", "greedy"],
)
def test_raw_vllm_log_probs_of_another_distribution_warn_by_name(gen, warns):
    infer = {
        "generating_args": gen,
        "strategy_args": {
            "strategy_name": "vllm",
            "strategy_config": {"logprobs_mode": "raw_logprobs"},
        },
    }
    warnings = _components({"actor_infer": infer}).warnings
    key = "actor_infer.strategy_args.strategy_config.logprobs_mode=raw_logprobs"
    assert any(key in w for w in warnings) == warns, warnings


def test_a_repetition_penalty_warns_by_name():
    """The engines record log-probs after the penalty; the trainer does not reproduce it."""
    gen = {"repetition_penalty": 1.1}
    warnings = _components({"actor_infer": {"generating_args": gen}}).warnings
    assert any("actor_infer.generating_args.repetition_penalty=1.1" in w for w in warnings)
    assert not any("repetition_penalty" in w for w in _components().warnings)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (
            {
                "strategy_args": {
                    "strategy_name": "fsdp2_train",
                    "strategy_config": {"packed_forward": True},
                }
            },
            r"actor_train\.share_prompt_forward: cannot be combined with .*packed_forward",
        ),
        (
            {"model_args": {"attn_implementation": "fa2", "dtype": "bf16"}},
            r"actor_train\.share_prompt_forward: needs attn_implementation sdpa or eager",
        ),
    ],
    ids=["packed_forward", "flash_attention"],
)
def test_share_prompt_forward_refused_where_it_cannot_run(extra, match):
    extra = {"actor_train": {"share_prompt_forward": True, **extra}}
    with pytest.raises(ValueError, match=match):
        _components(extra, device_kind="cuda", flash_attn_available=True)


def test_share_prompt_forward_refused_for_the_critic():
    critic = {
        "adv_estimator": "gae",
        "critic": {
            "share_prompt_forward": True,
            "training_args": {"per_device_train_batch_size": 2},
        },
    }
    with pytest.raises(ConfigError, match=r"critic\.share_prompt_forward"):
        _components(critic)


@pytest.mark.parametrize(
    ("estimator", "extra", "unread"),
    [
        ("grpo", {"lambd": 0.9, "gamma": 0.99}, ["lambd", "gamma"]),  # no critic, no discount
        ("reinforce", {"lambd": 0.9, "gamma": 0.99}, ["lambd"]),  # discounted returns read gamma
        ("gigpo", {"gamma": 0.99, "step_reward_gamma": 0.9}, ["gamma"]),
        ("grpo", {"episode_reward_weight": 0.5}, ["episode_reward_weight"]),
        ("grpo", {"step_reward_gamma": 0.9}, ["step_reward_gamma"]),
        ("grpo", {"lambd": 0.95, "gamma": 1.0}, []),  # written at their defaults: silent
    ],
)
def test_estimator_keys_the_estimator_never_reads_are_warned_about(estimator, extra, unread):
    warned = _components({"adv_estimator": estimator, **extra}).warnings
    named = sorted(w.split("=")[0] for w in warned if f"adv_estimator={estimator}" in w)
    assert named == sorted(unread)
    for key in unread:
        assert any(w.startswith(f"{key}={extra[key]!r} has no effect") for w in warned)


def test_a_resumed_kl_controller_keeps_only_an_adaptive_coefficient():
    """On resume the KL controller built from the config takes, from the checkpointed one, only
    the coefficient an adaptive controller evolved to: its target and horizon, a fixed
    coefficient and the kind of controller are the config's (resume_guard warns they apply)."""
    from rl_algos.kl_control import AdaptiveKLController, FixedKLController
    from rl_runtime.step.advantages import KLControlConfig, restore_kl_controller

    evolved = AdaptiveKLController(0.37, target=0.5, horizon=100).state_dict()
    adaptive = KLControlConfig(init_coef=0.2, target=0.01, horizon=50).build()
    restore_kl_controller(adaptive, evolved)
    assert adaptive == AdaptiveKLController(0.37, target=0.01, horizon=50)
    fixed = KLControlConfig(init_coef=0.2).build()
    restore_kl_controller(fixed, evolved)
    assert fixed == FixedKLController(0.2)
    restore_kl_controller(fixed, FixedKLController(0.9).state_dict())
    assert fixed == FixedKLController(0.2)
    now_adaptive = KLControlConfig(init_coef=0.2, target=0.01).build()
    restore_kl_controller(now_adaptive, FixedKLController(0.9).state_dict())
    assert now_adaptive.value == 0.2  # the checkpoint's controller was fixed: the config's start
