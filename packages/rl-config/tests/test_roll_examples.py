"""ROLL's own example configs (tests/data/roll, see its README): every agentic, RLVR and DPO
example without Megatron passes the check; every Megatron one fails with the single message, and
``rl-config convert`` turns it into a config that passes."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest

from rl_config import ConfigError, load_config
from rl_config.convert import convert_file, dump

ROLL = Path(__file__).parent / "data" / "roll"


def manifest() -> list[dict[str, str]]:
    with (ROLL / "MANIFEST.tsv").open() as f:
        return list(csv.DictReader(f, delimiter="\t"))


ROWS = manifest()
PLAIN = [r for r in ROWS if r["strategy"] != "megatron"]
MEGATRON = [r for r in ROWS if r["strategy"] == "megatron"]


def sample(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The first Megatron example of each (version, kind) in the default run; all of them under
    ``-m slow`` (a ROLL file takes ~0.6 s to compose: pure-Python YAML)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for row in rows:
        group = (row["version"], row["kind"])
        mark = [] if group not in seen else [pytest.mark.slow]
        seen.add(group)
        out.append(pytest.param(row, id=key(row), marks=mark))
    return out


PARTIAL_GPU = "partial-GPU mode"
REFUSED_AFTER_CONVERT: dict[str, str] = {
    # 'needs value estimates': gae without a critic (ROLL's docs example); ml_tracker:
    # Alibaba's internal tracker; 'outside the 8 declared': num_nodes: 1 written while device
    # ids reach 15 (ROLL overrides it silently); PARTIAL_GPU: async with actor_train's devices a
    # subset of actor_infer's (ROLL's partial-GPU mode)
    "head/examples/agentic_demo/agent_val_rock_swe_qwen35_2b.yaml": PARTIAL_GPU,
    "head/examples/agentic_demo/openreward_endless_terminals_reinforce_qwen35_2b.yaml": PARTIAL_GPU,
    "head/examples/docs_examples/example_topr.yaml": "needs value estimates",
    "head/examples/dpo_examples/qwen3-30BA3B-dpo_megatron_80GB.yaml": "outside the 8 declared",
    "head/examples/qwen3.5-35BA3-rlvr_megatron/rlvr_megatron_ppu.yaml": "'ml_tracker' is not allowed",
    "head/examples/video-rlvr/video_r1.yaml": "'ml_tracker' is not allowed",
    "v0.2.1/examples/docs_examples/example_topr.yaml": "needs value estimates",
    "v0.2.1/examples/dpo_examples/qwen3-30BA3B-dpo_megatron_80GB.yaml": "outside the 8 declared",
}


def test_roll_refused_lists_name_real_files() -> None:
    keys = {key(r) for r in ROWS}
    assert set(REFUSED_AFTER_CONVERT) <= keys


def key(row: dict[str, str]) -> str:
    return f"{row['version']}/{row['path']}"


def test_roll_manifest_counts() -> None:
    """The counts reported in docs/rl-config.md (per ROLL version and pipeline kind)."""
    counts = Counter((r["version"], r["kind"], r["strategy"]) for r in ROWS)
    assert counts[("head", "agentic", "-")] == 4
    assert counts[("head", "rlvr", "-")] == 7
    assert counts[("v0.2.1", "agentic", "-")] == 3
    assert counts[("v0.2.1", "rlvr", "-")] == 3
    assert sum(n for (v, _, s), n in counts.items() if s == "megatron") == len(MEGATRON) == 156
    assert all((ROLL / r["version"] / r["path"]).is_file() for r in ROWS)


def only_refused_keys(error: ConfigError) -> bool:
    """Whether every issue is a key ``rl_config.contract.CHANGES_WHAT_IS_TRAINED`` refuses (a reward
    domain that cannot be built ...): the example is otherwise valid."""
    return all(" is refused: " in issue.message for issue in error.issues)


def refused_by_contract(path: Path) -> list[str]:
    """The keys of a ROLL file that ``CHANGES_WHAT_IS_TRAINED`` refuses."""
    import yaml

    from rl_config.contract import changes_what_is_trained

    return [issue.path for issue in changes_what_is_trained(yaml.safe_load(path.read_text()))]


def test_roll_examples_refused_for_what_they_would_train_are_counted() -> None:
    """The plain examples with reward domains that cannot be built (the refusals
    docs/rl-config.md reports): each is refused by name instead of trained otherwise."""
    refused = [r for r in PLAIN if refused_by_contract(ROLL / r["version"] / r["path"])]
    assert len(refused) == REFUSED_PLAIN_EXAMPLES


REFUSED_PLAIN_EXAMPLES = 6


@pytest.mark.parametrize("row", PLAIN, ids=key)
def test_roll_example_without_megatron_passes_check(row: dict[str, str]) -> None:
    path = ROLL / row["version"] / row["path"]
    if refused_by_contract(path):
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert only_refused_keys(info.value), str(info.value)
        return
    cfg = load_config(path)
    assert cfg.pipeline_kind == row["kind"]
    for warning in cfg.config_warnings():  # every accepted-but-unimplemented key is named
        assert ":" in warning


@pytest.mark.parametrize("row", sample(MEGATRON))
def test_roll_megatron_example_fails_with_one_message(row: dict[str, str]) -> None:
    path = ROLL / row["version"] / row["path"]
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (issue,) = info.value.issues
    assert "Megatron-LM is not implemented" in issue.message
    assert "strategy_args.strategy_name=megatron_" in issue.message
    assert f"rl-config convert {path} --strategy fsdp2|deepspeed -o OUT" in issue.message
    assert issue.path.endswith(".strategy_args.strategy_name")


@pytest.mark.parametrize("row", sample(MEGATRON))
def test_roll_megatron_example_converted_to_fsdp2_passes_check(
    row: dict[str, str], tmp_path: Path
) -> None:
    path = ROLL / row["version"] / row["path"]
    conversion = convert_file(path, "fsdp2")
    out = tmp_path / "converted.yaml"
    out.write_text(dump(conversion, str(path), "fsdp2"))
    if key(row) in REFUSED_AFTER_CONVERT:
        with pytest.raises(ConfigError) as info:
            load_config(out)
        text = str(info.value)  # its own refusal, or first the contract's (what it would train)
        assert REFUSED_AFTER_CONVERT[key(row)] in text or (
            refused_by_contract(out) and only_refused_keys(info.value)
        ), text
        return
    if refused_by_contract(out):  # reward domains that cannot be built ...
        with pytest.raises(ConfigError) as info:
            load_config(out)
        assert only_refused_keys(info.value), str(info.value)
        return
    cfg = load_config(out)
    for role, worker in cfg.workers().items():
        assert worker.strategy_args is not None
        assert not worker.strategy_args.strategy_name.startswith("megatron"), role
    assert any(note.startswith("dropped ") for note in conversion.notes)


@pytest.mark.parametrize(
    ("path", "pipeline", "marker"),
    [
        ("head/examples/qwen2.5-vl-7B-distill/distill_vl_fsdp2.yaml", "distillation", "student"),
    ],
)
def test_roll_pipelines_this_stack_lacks_fail_with_one_message(path, pipeline, marker):
    """ROLL's distillation examples (without Megatron): one error naming the pipeline, not one
    'unknown key; did you mean ...' per key of it. (ROLL's SFT examples load as SFT configs:
    tests/test_sft_app.py.)"""
    with pytest.raises(ConfigError) as info:
        load_config(ROLL / path)
    (issue,) = info.value.issues
    assert issue.path == marker
    assert f"a config of ROLL's {pipeline} pipeline" in issue.message
    assert "not implemented in this stack" in issue.message and "apps/rlvr" in issue.message
