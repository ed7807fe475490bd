"""The RLVR reward keys of rl-config feed rl-envs' reward router: the schema's reward names are
the router's, and every non-Megatron ROLL example's ``rewards`` section builds a routing spec."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import get_args

import pytest

from rl_config import load_config
from rl_config.schema import DomainRewardName, ExperimentConfig
from rl_envs.rewards import DOMAIN_REWARDS, reward_router_spec

ROLL = Path(__file__).resolve().parents[1] / "packages/rl-config/tests/data/roll"


def test_schema_reward_names_are_the_router_names():
    assert set(get_args(DomainRewardName)) == set(DOMAIN_REWARDS)


def _rlvr_examples() -> list[Path]:
    with (ROLL / "MANIFEST.tsv").open() as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    return [ROLL / r["version"] / r["path"] for r in rows
            if r["kind"] == "rlvr" and r["strategy"] != "megatron"]  # fmt: skip


@pytest.mark.parametrize("path", _rlvr_examples()[:3], ids=lambda p: p.name)
def test_roll_rlvr_example_rewards_build_a_routing_spec(path):
    """Each example's reward domains route (those that cannot be built are refused at load,
    rl_config.contract.CHANGES_WHAT_IS_TRAINED: left out here, as a user would)."""
    import yaml

    from rl_config.contract import changes_what_is_trained

    refused = changes_what_is_trained(yaml.safe_load(path.read_text()))
    assert all(i.path.startswith("rewards.") for i in refused)
    cfg = load_config(path, [f"~{i.path.rsplit('.', 1)[0]}" for i in refused])
    spec = reward_router_spec(
        {k: v.model_dump() for k, v in cfg.rewards.items()},
        cfg.custom_reward_function.model_dump(),
        allow_unsupported=True,
    )
    assert set(spec.domains) | set(spec.unsupported) == set(cfg.rewards)
    for name, domain in spec.domains.items():
        assert set(domain.tags) == set(cfg.rewards[name].tag_included)


def test_config_sections_route_rows():
    cfg = ExperimentConfig.model_validate(
        {
            "pretrain": "m",
            "rewards": {
                "math_rule": {"worker_cls": "roll.x.MathRuleRewardWorker", "tag_included": ["a"]},
                "code_sandbox": {"tag_included": ["KodCode"], "timeout_s": 3},
                "mine": {"reward_fn": "custom", "tag_included": ["c"]},
            },
            "custom_reward_function": {"path": "reward.py", "name": "score", "style": "trl"},
        }
    )
    spec = reward_router_spec(cfg.rewards, cfg.custom_reward_function)
    assert {n: d.reward_fn for n, d in spec.domains.items()} == {
        "math_rule": "math_rule", "code_sandbox": "code_sandbox", "mine": "custom"}  # fmt: skip
    assert spec.domains["code_sandbox"].timeout_s == 3
    assert spec.custom is not None and (spec.custom.name, spec.custom.style) == ("score", "trl")
    assert spec.domain_of("c") == "mine" and spec.domain_of("zzz") == "math_rule"
