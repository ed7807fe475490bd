"""rl_runtime.pipelines.dpo.compose: a preference key the chosen loss does not read is warned about."""

from __future__ import annotations

from typing import Any

import pytest

from rl_config.schema import ExperimentConfig
from rl_runtime.pipelines.dpo.compose import compose_dpo

DATA = {"actor_train": {"data_args": {"file_name": "train.jsonl"}}}


def _warnings(**keys: Any) -> list[str]:
    cfg = ExperimentConfig.model_validate({"pretrain": "tiny", **DATA, **keys})
    return [w.split("=")[0] for w in compose_dpo(cfg).warnings if "has no effect" in w]


@pytest.mark.parametrize(
    ("keys", "unread"),
    [
        ({"loss_type": "ipo", "label_smoothing": 0.1}, ["label_smoothing"]),
        ({"ipo": True, "label_smoothing": 0.1}, ["label_smoothing"]),
        ({"loss_type": "sigmoid", "simpo_gamma": 1.0}, ["simpo_gamma"]),
        ({"loss_type": "orpo", "kto_undesirable_weight": 2.0}, ["kto_undesirable_weight"]),
        ({"loss_type": "simpo", "precompute_ref_log_probs": False}, ["precompute_ref_log_probs"]),
        ({"loss_type": "sigmoid", "label_key": "lab"}, ["label_key"]),
    ],
)
def test_a_preference_key_the_loss_does_not_read_is_warned_about(keys, unread):
    """These validated and then did nothing, silently (e.g. cDPO's label_smoothing with ipo)."""
    assert _warnings(**keys) == unread


def test_the_keys_each_loss_reads_are_not_warned_about():
    assert _warnings(loss_type="sigmoid", label_smoothing=0.1, beta=0.2) == []
    assert _warnings(loss_type="simpo", label_smoothing=0.1, simpo_gamma=1.0) == []
    assert _warnings(loss_type="kto", kto_desirable_weight=2.0, label_key="lab") == []
    assert _warnings(loss_type="ipo", precompute_ref_log_probs=False) == []


def test_a_lora_actors_reference_is_its_base_model_without_a_reference_worker():
    lora = {"model_args": {"lora_target": "all-linear"}, **DATA["actor_train"]}
    cfg = ExperimentConfig.model_validate({"pretrain": "tiny", "actor_train": lora})
    c = compose_dpo(cfg)
    assert c.reference_from_actor and c.role("reference") is None
    assert c.preference.reference == "cached"  # the cache is filled through the actor
    plain = compose_dpo(ExperimentConfig.model_validate({"pretrain": "tiny", **DATA}))
    assert not plain.reference_from_actor and plain.role("reference") is not None
