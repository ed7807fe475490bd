"""rl_config.contract.CHANGES_WHAT_IS_TRAINED: each entry is refused by name at check time (the
keys whose omission would change what is trained: reward domains that cannot be built ...),
where they were a warning among many and the run trained something else."""

from __future__ import annotations

import pytest

from rl_config import ConfigError
from rl_config.cli import main
from rl_config.contract import CHANGES_WHAT_IS_TRAINED
from rl_config.schema import ExperimentConfig


def _config_with(pattern: str) -> tuple[dict, str]:
    """A minimal config setting the key of `pattern` (ROLE: actor_train, *: a domain name) to
    a value the pattern refuses; the key's dotted path."""
    key, _, want = pattern.partition("=")
    path = key.replace("ROLE", "actor_train").replace("*", "judge").split(".")
    value: object = want.replace("*", "roll.pipeline.rlvr.rewards.") if want else 8
    data: dict = {"pretrain": "m"}
    node = data
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    return data, ".".join(path)


@pytest.mark.parametrize("pattern", list(CHANGES_WHAT_IS_TRAINED))
def test_each_entry_is_refused_by_name(pattern):
    data, key = _config_with(pattern)
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.model_validate(data)
    assert any(i.path == key and " is refused: " in i.message for i in info.value.issues), str(
        info.value
    )


def test_unset_values_pass_and_other_reward_workers_build():
    ExperimentConfig.model_validate(
        {
            "pretrain": "m",
            "reward_model": None,
            "importance_sampling": "",
            "rewards": {"math": {"worker_cls": "roll.x.MathRuleRewardWorker"}},
        }
    )


def test_rl_config_check_fails_on_a_reward_domain_that_cannot_be_built(tmp_path, capsys):
    """ROLL's IFEval domain was one warning among many and the run trained on the other
    domains' rewards; `rl-config check` now fails naming it. ROLL's LLM-judge and
    CrossThink-QA domains are scored here: they pass."""
    config = tmp_path / "ifeval.yaml"
    config.write_text(
        "pretrain: m\nrewards:\n  ifeval:\n    worker_cls: "
        "roll.pipeline.rlvr.rewards.ifeval_rule_reward_worker.GeneralRuleRewardWorker\n"
        "    tag_included: [ifeval]\n"
    )
    assert main(["check", str(config), "-q"]) == 1
    err = capsys.readouterr().err
    assert "rewards.ifeval.worker_cls: " in err and "is refused: IFEval instruction" in err
    judge = tmp_path / "judge.yaml"
    judge.write_text(
        "pretrain: m\nrewards:\n  llm_judge:\n    worker_cls: "
        "roll.pipeline.rlvr.rewards.llm_judge_reward_worker.LLMJudgeRewardWorker\n"
        "    tag_included: [RLVR]\n  mcq:\n    worker_cls: "
        "roll.pipeline.rlvr.rewards.crossthinkqa_rule_reward_worker.CrossThinkQARuleRewardWorker\n"
    )
    assert main(["check", str(judge), "-q"]) == 0, capsys.readouterr().err
