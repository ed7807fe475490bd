"""Model rewards through apps/rlvr: a generative judge and a reward model, each on a role of
its own placed by device_mapping, score RLVR rollouts end to end (2 CPU steps, tiny local
models); ROLL's llm_judge examples dry-run after `rl-config convert` with their paths changed,
and the 8-GPU judge example trains 2 CPU steps with its devices and sizes overridden;
the keys of a model domain are read, not warned about."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from tests.app_loading import app_main, run_in_process

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "rlvr"
ROLL = ROOT / "packages" / "rl-config" / "tests" / "data" / "roll"
JUDGE_EXAMPLES = (
    "head/examples/qwen2.5-7B-rlvr_megatron/rlvr_config_8gpus_llm_as_judge.yaml",
    "head/examples/qwen3-8B-rlvr_fsdp2/rlvr_config.yaml",
)


def _converted(name: str, tmp_path: Path, or_verdict: str | None = None) -> list[str]:
    """ROLL's example converted (megatron -> fsdp2) with its paths changed to local ones (the
    tiny policy, a scripted judge saying yes, or either verdict with `or_verdict`, small data
    files in its tags, outputs under `tmp_path`), as a user would before running it here;
    returns the app's arguments for a dry run."""
    from rl_config.convert import convert_file, dump
    from rl_rollout.tiny_model import default_tiny_model_dir
    from rl_rollout.tiny_reward_models import build_scripted_judge

    out = tmp_path / "converted.yaml"
    out.write_text(dump(convert_file(ROLL / name, "fsdp2"), str(ROLL / name), "fsdp2"))
    data = yaml.safe_load(out.read_text())
    policy = str(default_tiny_model_dir())
    data["pretrain"] = data["reward_pretrain"] = policy
    data["rewards"]["llm_judge"]["model_args"]["model_name_or_path"] = str(
        build_scripted_judge(tmp_path / "judge", "yes", or_verdict=or_verdict)
    )
    tags = [t for domain in data["rewards"].values() for t in domain.get("tag_included", [])]
    rows = [{"messages": [{"role": "user", "content": f"question {i}"}], "ground_truth": "A",
             "tag": tag} for i, tag in enumerate(tags * 2)]  # fmt: skip
    files = tmp_path / "data.jsonl"
    files.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data["actor_train"]["data_args"]["file_name"] = [str(files)]
    if data.get("validation"):
        data["validation"]["data_args"]["file_name"] = [str(files)]
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    outputs = tmp_path / "out"
    return ["--config", str(out), "--dry-run", f"output_dir={outputs}",
            f"checkpoint_config.output_dir={outputs / 'ckpt'}", "rlvr_app.num_cpus=16"]  # fmt: skip


def test_roll_judge_example_dry_runs_with_a_judge_role_on_its_devices(tmp_path, capsys):
    code = app_main("rlvr")(_converted(JUDGE_EXAMPLES[0], tmp_path))
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert "reward_llm_judge workers=2 devices=[6, 7]" in stdout
    assert f"reward_llm_judge strategy=vllm devices=[6, 7] model={tmp_path / 'judge'}" in stdout
    assert "verdict='yes_no'" in stdout and "kind='llm_judge'" in stdout
    for key in ("judge_prompt", "generating_args", "device_mapping", "strategy_args"):
        assert f"rewards.llm_judge.{key}" not in stdout  # read, not "has no effect"
    assert "rewards.llm_judge.model_args.attn_implementation has no effect" in stdout
    assert "refus" not in (stdout + err).lower()


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
@pytest.mark.usefixtures("shared_ray")  # in-process runs on the module's Ray cluster
def test_roll_judge_example_trains_two_cpu_steps_with_tiny_models(tmp_path):
    """ROLL's 8-GPU llm_judge example, converted, with local paths and what a CPU host needs
    changed on the command line (2 devices: the policy's roles on one, the judge on the other;
    HF engines; small batches): a judge that says yes or no at random scores every response,
    nothing fails, and the groups it splits train the policy (optimizer steps taken)."""
    args = _converted(JUDGE_EXAMPLES[0], tmp_path, or_verdict="no")
    args.remove("--dry-run")
    out = tmp_path / "out"
    cpu = ["max_steps=2", "eval_steps=100", "save_steps=1000", "track_with=stdout",
           f"tracker_kwargs.log_dir={out / 'logs'}", "validation=null", "num_gpus_per_node=2",
           "actor_train.device_mapping=[0]", "actor_infer.device_mapping=[0]",
           "reference.device_mapping=[0]", "rewards.llm_judge.device_mapping=[1]",
           "actor_infer.strategy_args={strategy_name: hf_infer}",
           "rewards.llm_judge.strategy_args={strategy_name: hf_infer}",
           "rewards.llm_judge.generating_args.max_new_tokens=4", "rollout_batch_size=4",
           "num_return_sequences_in_group=4", "prompt_length=64", "response_length=8",
           "actor_train.training_args.per_device_train_batch_size=4",
           "actor_train.training_args.gradient_accumulation_steps=2",
           # the random tiny policy never ends a response: ROLL's mask of truncated ones would
           # leave nothing to train on
           "max_len_mask=false"]  # fmt: skip
    args = [a for a in args if not a.startswith("rlvr_app.num_cpus=")] + ["rlvr_app.num_cpus=2"]
    proc = run_in_process("rlvr", [*args, *cpu], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0 and "reward/domain/llm_judge/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["reward/domain/llm_judge/failed"] == 0 and r["reward/failed"] == 0 for r in steps)
    judged = [r["reward/domain/llm_judge/mean"] for r in steps]
    assert 0 < sum(judged) / 2 < 1, judged  # yes and no, not one verdict throughout
    assert sum(r["train/optimizer_steps"] for r in steps) >= 1


def test_roll_multi_domain_example_judges_scores_crossthinkqa_and_refuses_ifeval_by_name(
    tmp_path, capsys
):
    code = app_main("rlvr")(_converted(JUDGE_EXAMPLES[1], tmp_path))
    stdout, err = capsys.readouterr()
    text = stdout + err
    assert code == 1, text  # refused by name at check time: its IFEval domain
    assert "rewards.ifeval.worker_cls" in err and "IFEval instruction-following rules" in err
    assert "CrossThink-QA rules" not in text and "LLM judge" not in text  # both scored now
    args = _converted(JUDGE_EXAMPLES[1], tmp_path)  # without the IFEval domain: it plans
    data = yaml.safe_load(Path(args[1]).read_text())
    del data["rewards"]["ifeval"]
    del data["actor_train"]["data_args"]["domain_interleave_probs"]["ifeval"]
    Path(args[1]).write_text(yaml.safe_dump(data, sort_keys=False))
    assert app_main("rlvr")(args) == 0, capsys.readouterr().err
    stdout = capsys.readouterr().out
    assert "reward_llm_judge workers=4 devices=[12, 13, 14, 15]" in stdout
    flat = " ".join(stdout.split())
    assert "DomainRewardSpec(domain='crossthinkqa', reward_fn='crossthinkqa'," in flat
    assert "reward_type='soft'" in flat


def test_judge_keys_are_checked_by_name(tmp_path):
    from rl_config.loading import load_app_config
    from rl_runtime.pipelines.rlvr.compose import build_rlvr

    config = APP / "configs" / "cpu_default.yaml"
    base = ["rewards.j.reward_fn=llm_judge", "rewards.j.model_args.model_name_or_path=/m",
            "rewards.j.device_mapping=[0]"]  # fmt: skip
    cases = {
        "rewards.j.judge_model_type=api": "rewards.j.judge_model_type='api': only inference",
        "rewards.j.judge_prompt=Qwen9-judge": "rewards.j.judge_prompt='Qwen9-judge': neither",
        "rewards.j.reward_normalize=true": "rewards.j.reward_normalize: applies to reward_model",
        "rewards.j.strategy_args.strategy_name=sglang": "strategy_name='sglang': unknown engine",
        "rewards.j.world_size=3": "rewards.j.world_size=3: its device_mapping gives 1 workers",
        "rewards.j.device_mapping=null": "rewards.j.device_mapping: llm_judge runs on workers",
    }
    for override, error in cases.items():
        cfg, _ = load_app_config(config, [*base, override], section="rlvr_app")
        with pytest.raises(ValueError, match=error.replace("(", r"\(").replace("[", r"\[")):
            build_rlvr(cfg)
    cfg, _ = load_app_config(config, [*base[:2], "rewards.j.reward_fn=reward_model",
                                      "rewards.j.device_mapping=[0]",
                                      "rewards.j.judge_verdict=yes_no"], section="rlvr_app")  # fmt: skip
    with pytest.raises(ValueError, match="rewards.j.judge_verdict: a reward model does not"):
        build_rlvr(cfg)


def _tagged_data(tmp_path: Path) -> tuple[str, str]:
    """The CPU default's arithmetic rows, tagged alternately `judged` and `rm` (one domain
    each)."""
    import pyarrow.parquet as pq

    from rl_envs.tasks.arith import write_arith_parquet

    paths = write_arith_parquet(str(tmp_path / "data"), kind="max", val_fraction=0.3, seed=0)
    for path in paths:
        table = pq.read_table(path)
        tags = ["judged" if i % 2 else "rm" for i in range(table.num_rows)]
        pq.write_table(table.append_column("tag", [tags]), path)
    return paths


def _judge_and_rm_config(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    """apps/rlvr's CPU default on 2 devices with two model domains: `judged` (the scripted judge
    says yes to every response: reward 1.0 each) on device 1, `rm` (a tiny reward model,
    normalised) on device 0 beside the policy's trainer (it sleeps between scorings); small
    steps. Returns the config file and the overrides both apps take."""
    from rl_rollout.tiny_reward_models import build_scripted_judge, build_tiny_reward_model

    train, test = _tagged_data(tmp_path)
    judge = build_scripted_judge(tmp_path / "judge", "yes")
    rm = build_tiny_reward_model(tmp_path / "rm")
    data = yaml.safe_load((APP / "configs" / "cpu_default.yaml").read_text())
    data["num_gpus_per_node"] = 2
    data["rewards"] = {
        "judged": {"worker_cls": "roll.pipeline.rlvr.rewards.llm_judge_reward_worker.LLMJudgeRewardWorker",
                   "judge_prompt": "Qwen2.5-7B-Instruct-RLVR-prompt", "judge_model_type": "inference",
                   "tag_included": ["judged"], "model_args": {"model_name_or_path": str(judge)},
                   "generating_args": {"max_new_tokens": 4, "temperature": 0.8},
                   "strategy_args": {"strategy_name": "hf_infer"}, "device_mapping": "list(range(1,2))",
                   "infer_batch_size": 8, "timeout_s": 300},
        "rm": {"reward_fn": "reward_model", "tag_included": ["rm"], "reward_normalize": True,
               "model_args": {"model_name_or_path": str(rm)}, "device_mapping": [0]},
    }  # fmt: skip
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    overrides: dict[str, object] = {
        "pretrain": tmp_path / "tiny_model", "rlvr_app.build_tiny_model": tmp_path / "tiny_model",
        "track_with": "stdout", "max_steps": 2,
        "eval_steps": 2, "save_steps": 1000, "rollout_batch_size": 4,
        "num_return_sequences_in_group": 4, "val_batch_size": 4, "val_n_sample": 1,
        "actor_train.training_args.per_device_train_batch_size": 8,
        "actor_train.training_args.gradient_accumulation_steps": 2,
        "actor_train.data_args.file_name": train, "actor_train.data_args.eval_file_name": test,
        "rlvr_app.arith_data.generate": "false", "rlvr_app.warmup.steps": 0,
        "dynamic_sampling.enable": "false",
    }  # fmt: skip
    return config, overrides


def _assert_scored_steps(log_dir: Path) -> list[dict]:
    """Both model domains scored every step of the run, nothing failed, two steps trained."""
    rows = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0 and "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["reward/domain/judged/mean"] == 1.0 and r["reward/domain/judged/failed"] == 0
        assert "reward/domain/rm/mean" in r and r["reward/domain/rm/failed"] == 0
        assert r["reward/failed"] == 0 and r.get("failures/reward_failures", 0) == 0
        assert math.isfinite(r["train/loss"])
    return steps


def _run(app: str, config: Path, overrides: dict[str, object], cwd: Path) -> None:
    argv = ["--config", str(config), *(f"{k}={v}" for k, v in overrides.items())]
    proc = run_in_process(app, argv, cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
@pytest.mark.usefixtures("shared_ray")  # in-process runs on the module's Ray cluster
def test_rlvr_trains_two_steps_scored_by_a_judge_and_a_reward_model(tmp_path):
    """apps/rlvr on Ray, 2 devices: the policy's roles and the reward model share device 0,
    the judge has device 1; both domains count in each step's reward metrics."""
    config, overrides = _judge_and_rm_config(tmp_path)
    out = tmp_path / "run"
    overrides |= {"output_dir": out, "logging_dir": out / "logs",
                  "checkpoint_config.output_dir": out / "ckpt"}  # fmt: skip
    _run("rlvr", config, overrides, tmp_path)
    _assert_scored_steps(out / "logs")


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
@pytest.mark.usefixtures("shared_ray")  # in-process runs on the module's Ray cluster
def test_async_app_trains_both_runs_scored_by_a_judge_and_a_reward_model(tmp_path):
    """apps/async (the same config twice: synchronous, then one-step-off) with actor_infer on
    device 1 beside the judge: the rollout thread scores with both models while the trainer
    trains on device 0 beside the reward model; each run trains two scored steps, and the
    asynchronous one within its staleness bound."""
    config, overrides = _judge_and_rm_config(tmp_path)
    out = tmp_path / "cmp"
    overrides |= {"output_dir": out, "actor_infer.device_mapping": "[1]"}
    _run("async", config, overrides, tmp_path)
    _assert_scored_steps(out / "sync" / "logs")
    steps = _assert_scored_steps(out / "async" / "logs")
    assert max(r["async/lag_max"] for r in steps) <= 1
    assert steps[-1]["async/dropped_stale_total"] == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["max_staleness"] == 1 and summary["async"]["steps"] == 2
