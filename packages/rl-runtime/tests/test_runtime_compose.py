"""rl_runtime.compose: each formerly silent config key reaches the component that uses it."""

from __future__ import annotations

import copy
import math
import re
from typing import Any

import pytest
import torch

from rl_config.errors import ConfigError
from rl_config.records import Trajectory, Turn
from rl_config.schema import ExperimentConfig
from rl_runtime.compose import compose
from rl_runtime.step.advantages import compute_advantages, update_kl_controller
from rl_runtime.step.collate import collate_trajectories
from rl_train.args import LogprobSampling
from rl_train.losses import build_actor_loss
from rl_train.types import ForwardOutput, LossContext

BASE: dict[str, Any] = {
    "pretrain": "tiny",
    "rollout_batch_size": 4,
    "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["FL"]},
    "val_env_manager": {"num_env_groups": 2, "group_size": 1, "tags": ["FL"]},
    "custom_envs": {"FL": {"env_type": "frozen_lake", "max_steps": 4}},
    "actor_train": {"training_args": {"per_device_train_batch_size": 2}},
}


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _components(extra: dict | None = None, **kwargs):
    return compose(ExperimentConfig.model_validate(_merge(BASE, extra or {})), **kwargs)


def _actor_loss(extra: dict):
    return build_actor_loss(_components(extra).role("actor_train").loss)


def _loss(loss_fn, log_ratio: float, adv: float, **batch_extra) -> float:
    """The loss of one token with ratio exp(log_ratio) and advantage `adv`."""
    old = torch.zeros(1, 1)
    batch = {
        "response_mask": torch.ones(1, 1, dtype=torch.bool),
        "old_log_probs": old,
        "advantages": torch.full((1, 1), adv),
        **batch_extra,
    }
    out = ForwardOutput(log_probs=old + log_ratio)
    loss, _ = loss_fn(batch, out, LossContext(global_tokens=1, global_seqs=1, max_seq_len=1))
    return float(loss)


def test_pg_clip_is_the_clip_range():
    # ratio 1.15, advantage +1: clipped at 1 + pg_clip (old code: always pg_clip_low/high = 0.2)
    loss = _actor_loss({"pg_clip": 0.1, "loss_agg_mode": "token-mean"})
    assert _loss(loss, math.log(1.15), 1.0) == pytest.approx(-1.1)
    wide = _actor_loss({"use_pg_clip_range": True, "pg_clip_high": 0.28})
    assert _loss(wide, math.log(1.5), 1.0) == pytest.approx(-1.28)


def test_dual_clip_c_bounds_negative_advantages():
    loss = _actor_loss({"dual_clip_loss": True, "dual_clip_c": 5.0})
    assert _loss(loss, math.log(10.0), -1.0) == pytest.approx(5.0)  # old code: 3.0
    assert _actor_loss({"dual_clip_c": 5.0}).__class__  # off without dual_clip_loss
    assert _loss(_actor_loss({"dual_clip_c": 5.0}), math.log(10.0), -1.0) == pytest.approx(10.0)


GSPO = {"actor_train": {"pg_variant": "gspo"}}


def _loss_cfg(comp, role: str = "actor_train") -> Any:
    """The loss config compose built for `role` (ActorLossConfig or CriticLossConfig)."""
    loss = comp.role(role).loss
    assert loss is not None
    return loss


def test_clip_range_reaches_gspo():
    # old code: gspo always ran with its own 3e-4/4e-4, whatever the config said
    extra = {**GSPO, "use_pg_clip_range": True, "pg_clip_low": 0.1, "pg_clip_high": 0.28}
    cfg = _loss_cfg(_components(extra))
    assert (cfg.clip_ratio_low, cfg.clip_ratio_high) == (0.1, 0.28)
    loss = build_actor_loss(cfg)
    assert _loss(loss, math.log(1.5), 1.0) == pytest.approx(-1.28)  # 1 + pg_clip_high
    assert _loss(loss, math.log(0.5), -1.0) == pytest.approx(0.9)  # 1 - pg_clip_low


def test_unwritten_clip_keys_keep_the_variants_published_default():
    cfg = _loss_cfg(_components(GSPO))
    assert (cfg.clip_ratio_low, cfg.clip_ratio_high) == (None, None)
    assert _loss(build_actor_loss(cfg), math.log(1.2), 1.0) == pytest.approx(-1.0004)  # 4e-4
    clip_cov = _actor_loss({"actor_train": {"pg_variant": "clip_cov"}, "pg_clip": 0.1})
    assert _loss(clip_cov, math.log(1.5), 1.0) == pytest.approx(-1.1)  # old code: 0.2


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"actor_train": {"pg_variant": "reinforce"}, "pg_clip": 0.3}, "pg_clip"),
        ({**GSPO, "dual_clip_loss": True}, "dual_clip_loss"),
        ({"actor_train": {"pg_variant": "kl_cov"}, "use_pg_clip_range": True}, "use_pg_clip_range"),
        (  # clip_cov's clip_ratio is symmetric
            {"actor_train": {"pg_variant": "clip_cov"}, "use_pg_clip_range": True,
             "pg_clip_high": 0.28},
            "use_pg_clip_range",
        ),
    ],
)  # fmt: skip
def test_clip_key_the_variant_cannot_read_is_refused_by_name(extra, key):
    with pytest.raises(ConfigError) as err:
        _components(extra)
    assert [issue.path for issue in err.value.issues] == [key]


def test_pg_clip_written_at_its_default_for_a_variant_without_clip_warns():
    comp = _components({"actor_train": {"pg_variant": "reinforce"}, "pg_clip": 0.2})
    assert _loss_cfg(comp).clip_ratio_low is None
    assert any(
        w.startswith("pg_clip=0.2 has no effect with pg_variant=reinforce") for w in comp.warnings
    )


DR_GRPO = {"loss_agg_mode": "seq-mean-token-sum-norm"}
CRITIC_SECTION = {
    "adv_estimator": "gae",
    "critic": {"training_args": {"per_device_train_batch_size": 2}},
}


def _response_grads(loss_cfg, prompt_len: int) -> list[float]:
    """dL/dlog_probs of two 4-token responses (A = 1) after a `prompt_len` prompt, with the
    padded width rl_train.core gives the LossContext."""
    width = prompt_len + 4
    mask = torch.zeros(2, width, dtype=torch.bool)
    mask[:, prompt_len:] = True
    lp = torch.zeros(2, width, requires_grad=True)
    batch = {"response_mask": mask, "old_log_probs": torch.zeros(2, width),
             "advantages": torch.ones(2, width)}  # fmt: skip
    ctx = LossContext(global_tokens=8.0, global_seqs=2.0, max_seq_len=width)
    loss, _ = build_actor_loss(loss_cfg)(batch, ForwardOutput(log_probs=lp), ctx)
    loss.backward()
    assert lp.grad is not None
    return lp.grad[mask].tolist()


def test_dr_grpo_divides_by_the_rlvr_response_length_not_the_batch_width():
    rlvr = {k: v for k, v in BASE.items() if not k.endswith("env_manager") and k != "custom_envs"}
    gen = {"generating_args": {"max_new_tokens": 16}}
    cfg = ExperimentConfig.model_validate(
        {**rlvr, **DR_GRPO, "response_length": 16, "actor_infer": gen}
    )
    comp = compose(cfg, pipeline="rlvr")
    actor = _loss_cfg(comp)
    assert actor.norm_constant == 16.0
    # old code: -1/(2*8) with a 4-token prompt, -1/(2*64) with a 60-token one
    assert _response_grads(actor, 4) == _response_grads(actor, 60) == [-1 / (2 * 16)] * 8


def test_dr_grpo_agentic_constant_is_the_generation_budget():
    # 4 turns of at most 24 tokens: 96 generated tokens at most (sequence_length 1024 is larger)
    comp = _components({**DR_GRPO, "max_tokens_per_step": 24})
    assert _loss_cfg(comp).norm_constant == 96.0
    # 20 turns of 24 tokens (480) do not fit sequence_length 256: the trajectory's budget is 256
    long_episodes = {"custom_envs": {"FL": {"max_steps": 20}}, "sequence_length": 256}
    capped = _components({**DR_GRPO, **long_episodes, "max_tokens_per_step": 24})
    assert _loss_cfg(capped).norm_constant == 256.0
    critic = _components({**DR_GRPO, **CRITIC_SECTION, "max_tokens_per_step": 24})
    assert _loss_cfg(critic, "critic").norm_constant == 96.0
    assert _loss_cfg(_components()).norm_constant is None  # other modes: none


def test_train_infer_correction_weights_the_loss():
    tic = {"train_infer_correction": {"is_weight": {"enabled": True, "upper_bound": 1.5}}}
    loss = _actor_loss(tic)
    # engine log-prob log(1/2) below the trainer's: IS weight 2, truncated at 1.5
    rollout = torch.full((1, 1), math.log(0.5))
    assert _loss(loss, 0.0, 1.0, rollout_log_probs=rollout) == pytest.approx(-1.5)
    filt = {"train_infer_correction": {"filters": [{"enabled": True, "ratio_high": 1.2}]}}
    assert _loss(_actor_loss(filt), 0.0, 1.0, rollout_log_probs=rollout) == pytest.approx(0.0)


def test_segment_level_correction_is_refused_by_name():
    tic = {"train_infer_correction": {"is_weight": {"enabled": True, "weight_type": "segment"}}}
    with pytest.raises(ValueError, match="is_weight.weight_type"):
        _components(tic)


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


ROLL_TURN = (
    "Turn {turn_idx}:\nObservation:\n{observation}\nYou have {actions_left} actions left. "
    "Max response length: {max_response_length} words (tokens).\n"
)


def test_roll_agent_templates_set_the_envs_prompts():
    """ROLL's `agent_system_template` / `agent_template` are the prompts the built env gives
    the agent loop (system message; each turn's user message, ROLL's placeholders filled)."""
    from rl_runtime.step.envs import make_envs

    envs = {"FL": {"agent_system_template": "Play well.", "agent_template": ROLL_TURN}}
    specs = _components({"custom_envs": envs}).env_specs
    ((env, _seed, _group, _tag),) = make_envs(
        [("g", "FL", 3)],
        {t: {"env_type": s.env_type, "config": s.config} for t, s in specs.items()},
    )
    observation, _ = env.reset()
    assert env.system_prompt() == "Play well."
    assert env.turn_prompt(observation, 0, 32) == (
        f"Turn 0:\nObservation:\n{observation}\nYou have 4 actions left. "
        "Max response length: 32 words (tokens).\n"
    )


@pytest.mark.parametrize(
    ("env", "key", "match"),
    [
        (
            {"agent_template": "{history}\n{observation}"},
            "custom_envs.FL.agent_template",
            r"\{history\} is filled by ROLL's step/GiGPO env managers",
        ),
        (
            {"agent_template": ROLL_TURN, "env_config": {"turn_template": "{observation}"}},
            "custom_envs.FL.agent_template",
            r"disagrees with custom_envs\.FL\.env_config\.turn_template",
        ),
        (
            {"env_type": "single_turn", "agent_template": ROLL_TURN},
            "custom_envs.FL.agent_template",
            r"env type 'single_turn' takes no turn_template \(its prompt options: system_prompt\)",
        ),
        (
            {"env_type": "tool_use", "agent_system_template": "Use tools."},
            "custom_envs.FL.agent_system_template",
            r"takes no system_prompt \(its prompt options: none\)",
        ),
        (
            {"env_type": "webshop"},
            "custom_envs.FL.env_type",
            r"unknown env 'webshop'; tags: .*env types: .*'sokoban'",
        ),
        # env options the env's constructor refuses: at compose, not in a worker after the
        # warm-up (countdown's unknown options were dropped silently)
        (
            {"env_config": {"is_slipery": True}},
            "custom_envs.FL.env_config.is_slipery",
            r"'frozen_lake' takes no option 'is_slipery'; did you mean 'is_slippery'\?",
        ),
        (
            {"env_type": "countdown", "env_config": {"num_numbrs": 3}},
            "custom_envs.FL.env_config.num_numbrs",
            r"did you mean 'num_numbers'\? \(its options: .*max_number, max_steps",
        ),
        (
            {"env_type": "single_turn"},
            "custom_envs.FL.env_config",
            r"env type 'single_turn': SingleTurnEnv needs rows or path",
        ),
        (
            {"env_type": "single_turn", "env_config": {"path": "no_such_file.jsonl"}},
            "custom_envs.FL.env_config",
            r"dataset file not found: no_such_file\.jsonl",
        ),
        (
            {"env_type": "tool_use", "env_config": {"tools": ["shell"]}},
            "custom_envs.FL.env_config",
            r"unknown tools \['shell'\]",
        ),
    ],
)
def test_env_prompts_and_types_compose_cannot_honour_are_refused_by_name(env, key, match):
    with pytest.raises(ConfigError) as info:
        _components({"custom_envs": {"FL": env}})
    (issue,) = info.value.issues
    assert issue.path == key
    assert re.search(match, issue.message), issue.message


def test_vllm_engine_options_are_checked_at_compose_without_vllm():
    """A typo'd or mistyped vllm key failed only when the engine started (vLLM is installed only
    in CI's vLLM step); now compose names each key, with the closest known one for a typo."""

    def infer(options: dict) -> dict:
        return {"actor_infer": {"strategy_args": {"strategy_name": "vllm",
                                                  "strategy_config": options}}}  # fmt: skip

    bad = {"gpu_memory_utilisation": 0.1, "enforce_eager": "yes", "block_size": 16}
    with pytest.raises(ConfigError) as err:
        _components(infer(bad))
    issues = {issue.path.rpartition(".")[2]: issue.message for issue in err.value.issues}
    assert sorted(issues) == ["enforce_eager", "gpu_memory_utilisation"]
    assert "did you mean 'gpu_memory_utilization'?" in issues["gpu_memory_utilisation"]
    assert issues["enforce_eager"] == "is 'yes'; use true or false"
    assert {issue.path for issue in err.value.issues} == {
        "actor_infer.strategy_args.strategy_config.gpu_memory_utilisation",
        "actor_infer.strategy_args.strategy_config.enforce_eager",
    }
    good = {"gpu_memory_utilization": 0.1, "enforce_eager": True, "block_size": 32}
    assert _components(infer(good)).role("actor_infer").strategy_config == good


def test_an_unknown_hf_engine_option_is_a_config_error_at_its_key():
    """The HF engine would refuse it in a rollout worker after Ray and the trainers started."""

    def infer(options: dict) -> dict:
        return {"actor_infer": {"strategy_args": {"strategy_name": "hf_infer",
                                                  "strategy_config": options}}}  # fmt: skip

    with pytest.raises(ConfigError) as err:
        _components(infer({"max_num_seq": 8, "recompute_kv_on_weight_update": False}))
    (issue,) = err.value.issues
    assert issue.path == "actor_infer.strategy_args.strategy_config.max_num_seq"
    assert "did you mean 'max_num_seqs'?" in issue.message
    plan = _components(infer({"recompute_kv_on_weight_update": False})).role("actor_infer")
    assert plan.strategy_config == {"recompute_kv_on_weight_update": False}


LORA_ACTOR = {"actor_train": {"model_args": {"lora_target": "q_proj,v_proj", "lora_rank": 4}}}


def test_lora_keys_reach_the_trained_roles_and_a_base_reference_is_the_actor():
    """ROLL's LoRA keys become actor_train's adapter; a KL to the reference, which is the
    actor's base model, then needs no reference worker (the actor disables its adapter)."""
    from rl_train.lora import LoraSettings

    c = _components(_merge(LORA_ACTOR, {"init_kl_coef": 0.1, "use_kl_loss": True}))
    assert c.role("actor_train").model_args.lora == LoraSettings(
        rank=4, alpha=8.0, target=("q_proj", "v_proj")
    )
    assert c.role("reference") is None and c.reference_from_actor
    assert any("no reference worker starts" in w for w in c.warnings)
    own = _components(
        _merge(
            LORA_ACTOR,
            {"use_kl_loss": True, "reference": {"model_args": {"model_name_or_path": "other"}}},
        )
    )
    assert own.role("reference") is not None and not own.reference_from_actor
    full = _components({"use_kl_loss": True})  # no LoRA: the reference worker as before
    assert full.role("reference") is not None and not full.reference_from_actor
    assert full.role("actor_train").model_args.lora is None
    no_kl = _components(LORA_ACTOR)  # nothing needs a reference
    assert no_kl.role("reference") is None and not no_kl.reference_from_actor


def test_a_lora_key_without_lora_target_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"actor_train\.model_args\.lora_rank is set but"):
        _components({"actor_train": {"model_args": {"lora_rank": 4}}})


def test_weight_syncs_carry_the_adapter_only_to_engines_that_take_it(tmp_path):
    from rl_runtime.compose import role_specs

    (tmp_path / "config.json").write_text("{}")  # a model directory, as role_specs checks

    def adapter_only(extra: dict) -> bool:
        specs = {
            s.role: s
            for s in role_specs(
                _components(_merge(extra, {"pretrain": str(tmp_path)})), str(tmp_path)
            )
        }
        return specs["actor_train"].init_kwargs["sync_adapter_only"]

    assert adapter_only(LORA_ACTOR)  # the HF engine merges the adapter into its base weights
    vllm = {"actor_infer": {"strategy_args": {"strategy_name": "vllm"}}}
    assert not adapter_only(_merge(LORA_ACTOR, vllm))  # vLLM without LoRA: merged weights
    merged = _components(_merge(LORA_ACTOR, vllm))
    assert any("enable_lora is off" in w for w in merged.warnings)
    lora_vllm = {"actor_infer": {"strategy_args": {"strategy_name": "vllm",
                                                   "strategy_config": {"enable_lora": True}}}}  # fmt: skip
    assert adapter_only(_merge(LORA_ACTOR, lora_vllm))  # vLLM loads the adapter by request
    by_request = _components(_merge(LORA_ACTOR, lora_vllm))
    # rank 4 -> the smallest max_lora_rank vLLM takes that holds it
    assert by_request.role("actor_infer").strategy_config == {"enable_lora": True,
                                                              "max_lora_rank": 8}  # fmt: skip
    rank_40 = _merge(lora_vllm, {"actor_train": {"model_args": {"lora_target": "all-linear",
                                                                "lora_rank": 40}}})  # fmt: skip
    assert _components(rank_40).role("actor_infer").strategy_config["max_lora_rank"] == 64
    own = _merge(rank_40, {"actor_infer": {"strategy_args": {"strategy_config": {
        "max_lora_rank": 128}}}})  # fmt: skip
    assert _components(own).role("actor_infer").strategy_config["max_lora_rank"] == 128
    unused = _components(lora_vllm)
    assert any("trains no LoRA adapter" in w for w in unused.warnings)
    assert not adapter_only(lora_vllm)
    assert not adapter_only({})  # no adapter
