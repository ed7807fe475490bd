"""rl_runtime.compose: each formerly silent loss key (clip ranges, dual clip, Dr. GRPO's
constant, train/infer correction) reaches the loss that uses it."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from compose_helpers import BASE, _components

from rl_config.errors import ConfigError
from rl_config.schema import ExperimentConfig
from rl_runtime.compose import compose
from rl_train.losses import build_actor_loss
from rl_train.types import ForwardOutput, LossContext


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


def test_optimal_token_baseline_has_the_actor_compute_sum_pi_squared_from_logits():
    """The estimator reads the actor's sum_pi_squared: the actor's training args ask its forward
    for it, and the fused log-prob head (no logits) is turned off with a warning, or refused by
    name when the config turns it on; other estimators leave both alone."""
    otb = {
        "adv_estimator": "optimal_token_baseline",
        "reward_normalization": {"method": "identity"},
    }
    comp = _components(otb)
    actor = comp.role("actor_train")
    assert actor.training_args.sum_pi_squared is True
    assert actor.strategy_config["fused_lm_head"] is False
    assert any("fused_lm_head: false" in w for w in comp.warnings)
    plain = _components().role("actor_train")
    assert plain.training_args.sum_pi_squared is False
    assert "fused_lm_head" not in plain.strategy_config
    on = {"actor_train": {"strategy_args": {"strategy_name": "fsdp2_train",
                                            "strategy_config": {"fused_lm_head": True}}}}  # fmt: skip
    with pytest.raises((ConfigError, ValueError), match="fused_lm_head: true"):
        _components({**otb, **on})
