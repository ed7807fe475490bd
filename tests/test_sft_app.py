"""`apps/sft`: ROLL's FSDP2 SFT examples dry-run with only their paths changed (steps from
num_train_epochs x rows as ROLL counts them), its Megatron ones are refused by name and run after
`rl-config convert`, SFT keys are refused or warned by name in other configs, and (slow) the app
trains 2 steps end to end with a checkpoint, held-out loss, summary.json, curves and hf_model/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rl_config import ConfigError, load_config
from tests.app_loading import app_main, assert_planned, run_in_process

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "sft"
CONFIG = APP / "configs" / "cpu_default.yaml"
ROLL = ROOT / "packages" / "rl-config" / "tests" / "data" / "roll" / "head" / "examples"
FSDP2_EXAMPLES = [
    "qwen3-30BA3B-sft_fsdp2/sft_config.yaml",
    "qwen3-30BA3B-sft_fsdp2/sft_config_ep.yaml",
    "qwen3.5-35BA3-sft_fsdp2/sft_config.yaml",
    "qwen3.5-35BA3-sft_fsdp2/sft_config_ep.yaml",
]
MEGATRON_EXAMPLES = {
    # converted, still refused by name: Alibaba's internal tracker
    "qwen3-30BA3B-sft_fsdp2/sft_config_megatron.yaml": "'ml_tracker' is not allowed",
    "qwen2.5-7B-sft_megatron/sft_config.yaml": None,
}
ALPACA = [
    {"instruction": f"write code {i}", "input": "" if i % 2 else "in python", "output": f"x = {i}"}
    for i in range(40)
]


def _with_paths(name: str, tmp: Path, source: Path | None = None) -> Path:
    """The ROLL file with only its paths changed: data files (alpaca-style rows written here),
    output and logging directories."""
    data = yaml.safe_load((source or ROLL / name).read_text())
    (tmp / "data").mkdir(exist_ok=True)
    (tmp / "data" / "train.json").write_text(json.dumps(ALPACA))
    (tmp / "data" / "val.json").write_text(json.dumps(ALPACA[:8]))
    role = "sft_train" if "sft_train" in data else "actor_train"  # converted: actor_train
    data[role]["data_args"]["file_name"] = str(tmp / "data" / "train.json")
    if "validation" in data:
        data["validation"]["data_args"]["file_name"] = str(tmp / "data" / "val.json")
    data["output_dir"], data["logging_dir"] = str(tmp / "out"), str(tmp / "logs")
    out = tmp / "sft.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


@pytest.mark.parametrize("name", FSDP2_EXAMPLES)
def test_roll_fsdp2_sft_examples_dry_run_with_only_paths_changed(name, tmp_path, capsys):
    path = _with_paths(name, tmp_path)
    assert load_config(path).pipeline_kind == "sft"
    code = app_main("sft")(["--config", str(path), "--dry-run"])
    out, err = capsys.readouterr()
    assert_planned(code, err)  # the 30B model and 8 GPUs are not on this host
    assert "actor_train  workers=8" in out
    # ROLL's step count: num_train_epochs 1 x 40 rows // (1 per device x 1 x 8 ranks)
    assert "'optimizer_steps_total': 5" in out and "'train_rows': 40" in out
    assert "packed=True" in out  # use_sequence_packing: True
    assert "prompt_key='instruction'" in out and "query_key='input'" in out
    text = out + err
    assert "sft_train: ROLL's SFT training section; read as actor_train" in text
    assert "fsdp_size: not supported, value ignored" in text  # accepted ROLL knobs, by name


@pytest.mark.parametrize(("name", "refused"), MEGATRON_EXAMPLES.items())
def test_roll_megatron_sft_examples_are_refused_by_name_then_run_converted(
    name, refused, tmp_path, capsys
):
    from rl_config.convert import convert_file, dump

    with pytest.raises(ConfigError) as info:
        load_config(ROLL / name)
    (issue,) = info.value.issues
    assert issue.path == "sft_train.strategy_args.strategy_name"
    assert (
        "Megatron-LM is not implemented" in issue.message and "rl-config convert" in issue.message
    )
    converted = tmp_path / "converted.yaml"
    converted.write_text(dump(convert_file(ROLL / name, "fsdp2"), str(ROLL / name), "fsdp2"))
    path = _with_paths(name, tmp_path, source=converted)
    if refused:
        with pytest.raises(ConfigError, match=refused):
            load_config(path)
        return
    code = app_main("sft")(["--config", str(path), "--dry-run"])
    out, err = capsys.readouterr()
    assert_planned(code, err)
    assert "strategy=fsdp2_train" in out


def test_sft_keys_elsewhere_and_both_sections_are_named(tmp_path):
    base = yaml.safe_load(CONFIG.read_text())
    both = {**base, "actor_train": base["sft_train"]}
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump(both))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.issues[0].path == "sft_train"
    # an SFT config: RL keys warn by name, RL-only refusals stay refusals
    plain = {k: v for k, v in base.items() if k != "sft_app"}
    path.write_text(yaml.safe_dump({**plain, "init_kl_coef": 0.2, "rollout_batch_size": 7}))
    cfg = load_config(path)
    assert cfg.pipeline_kind == "sft"
    warnings = cfg.config_warnings()
    assert any(w.startswith("init_kl_coef=0.2 has no effect: SFT has no KL term") for w in warnings)
    assert any(w.startswith("rollout_batch_size=7 has no effect: the SFT batch") for w in warnings)
    path.write_text(yaml.safe_dump({**plain, "sft_loss_coef": 0.5}))
    from rl_runtime.pipelines.sft.compose import compose_sft

    with pytest.raises(ConfigError, match="sft_loss_coef"):
        compose_sft(load_config(path))


def _run_app(tmp_path: Path, out: Path, expect: int = 0, **extra: object):
    """The CPU default on few generated rows, `extra` overrides on top; the finished run (its
    command line in this process: `run_in_process`)."""
    overrides: dict[str, object] = {
        "output_dir": out, "logging_dir": out / "logs", "checkpoint_config.output_dir": out / "ckpt",
        "pretrain": tmp_path / "tiny", "sft_app.build_tiny_model": tmp_path / "tiny",
        "sft_train.data_args.file_name": tmp_path / "data" / "train.jsonl",
        "validation.data_args.file_name": tmp_path / "data" / "heldout.jsonl",
        "track_with": "stdout", "max_steps": 2, "eval_steps": 2, "save_steps": 2,
        "sft_train.training_args.per_device_train_batch_size": 4,
        "sft_train.training_args.learning_rate": 3e-3,
        "sft_app.arithmetic.train_rows": 16, "sft_app.arithmetic.eval_rows": 8,
        **extra,
    }  # fmt: skip
    argv = ["--config", str(CONFIG), *(f"{k}={v}" for k, v in overrides.items())]
    proc = run_in_process("sft", argv, tmp_path)
    assert proc.returncode == expect, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def _trained(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "train/loss" in r]


@pytest.mark.slow
def test_the_app_trains_two_steps_end_to_end(tmp_path):
    """2 steps of the CPU default on a few generated rows: held-out loss before and after,
    checkpoint, summary.json, curves, hf_model/; the held-out loss goes down."""
    out = tmp_path / "run"
    _run_app(tmp_path, out)
    summary = json.loads((out / "summary.json").read_text())
    before, after = summary["eval_before"], summary["eval_after"]
    assert after["val/loss"] < before["val/loss"]
    assert after["val/perplexity"] == pytest.approx(2.718281828 ** after["val/loss"], rel=1e-9)
    assert (out / "hf_model" / "config.json").is_file()
    assert list((out / "ckpt").glob("step-000002/actor_train"))
    trained = _trained(out)
    assert [r["step"] for r in trained] == [1, 2]
    assert all(r["train/tokens"] > 0 for r in trained)


@pytest.mark.slow
def test_a_resumed_run_continues_at_the_next_batch_with_the_same_numbers(tmp_path):
    """16 rows, 4 per step: 4 steps are one epoch; a run stopped after step 2 and resumed from
    its checkpoint trains steps 3 and 4 on the uninterrupted run's batches, with its losses."""
    _run_app(tmp_path, tmp_path / "full", max_steps=4, eval_steps=0)
    full = _trained(tmp_path / "full")
    part = tmp_path / "part"
    _run_app(tmp_path, part, max_steps=2, eval_steps=0)
    _run_app(tmp_path, part, max_steps=4, eval_steps=0, resume_from_checkpoint="true")
    resumed = {r["step"]: r for r in _trained(part) if r["step"] > 2}
    assert sorted(resumed) == [3, 4]
    for r in full[2:]:
        assert resumed[r["step"]]["train/loss"] == pytest.approx(r["train/loss"], rel=1e-5)


@pytest.mark.slow
def test_malformed_rows_stop_the_run_before_it_starts_naming_file_and_row(tmp_path):
    data = tmp_path / "bad.jsonl"
    rows = [{"instruction": "a", "output": "1"}, {"messages": [{"role": "user", "content": "b"}]}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    proc = _run_app(
        tmp_path, out, expect=1, **{"sft_app.generate_arithmetic": "false",
                                    "sft_train.data_args.file_name": data,
                                    "validation.data_args.file_name": data},
    )  # fmt: skip
    assert not out.exists()  # the preflight's refusal: before anything starts
    assert f"{data}: malformed row(s) among the first 8: row 1: 'messages' (line 2): no " in (
        proc.stderr
    ), proc.stderr


def test_every_schema_key_is_read_by_the_sft_compose_or_declared_for_sft():
    """The key contract for SFT configs: each key compose_sft does not read is declared
    (refused or warned) for the sft pipeline, and no key it reads is declared."""
    from rl_config.contract import declared, schema_keys
    from rl_config.key_reads import KeyReads
    from rl_config.loading import compose_config
    from rl_config.schema import ExperimentConfig
    from rl_runtime.pipelines.sft.compose import compose_sft

    data = dict(compose_config(CONFIG, []).data)
    data.pop("sft_app")
    reads: dict[str, set[str]] = {}
    compose_sft(KeyReads(ExperimentConfig.model_validate(data), reads))
    held = {"data_args": {"file_name": "x", "template": "qwen2_5"}}
    with_validation = {**data, "validation": held}
    compose_sft(KeyReads(ExperimentConfig.model_validate(with_validation), reads))
    derived = {
        "actor_infer.model_args.model_name_or_path",
        "reference.model_args.model_name_or_path",
    }
    keys = [k for k in schema_keys() if k not in derived]  # filled from pretrain (as in DPO)
    missing = [k for k in keys if k not in reads and declared(k, "sft") is None]
    assert not missing, f"neither read by compose_sft nor declared for sft: {missing}"
    # read by the shared build_cluster / build_role, without effect on SFT's loss (warned)
    incidental = ("weight_sync_transport", "adv_estimator")
    both = sorted(k for k in reads if declared(k, "sft") is not None and k not in incidental)
    assert not both, f"read by compose_sft but declared unsupported/ignored for sft: {both}"


def test_deepspeed_and_lora_plan_through_the_app(capsys):
    """The other rl-train backend and a LoRA adapter reach the SFT plan (same keys as RL)."""
    code = app_main("sft")([
        "--dry-run", "sft_train.strategy_args.strategy_name=deepspeed_train",
        "sft_train.strategy_args.strategy_config={zero_optimization: {stage: 2}}",
        "sft_train.model_args.lora_target=all-linear", "sft_train.model_args.lora_rank=8",
    ])  # fmt: skip
    out, err = capsys.readouterr()
    assert_planned(code, err)
    assert "actor_train  strategy=deepspeed_train" in out
    assert "lora=LoraSettings(rank=8" in out
