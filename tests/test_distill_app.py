"""apps/distill: teachers' config and routing, the tokenizer refusal, the dry run and its
refusals, and (slow) two on-policy distillation steps end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rl_config import ConfigError, load_config
from rl_runtime.pipelines.distill.step import teacher_log_probs
from rl_runtime.pipelines.distill.teachers import build_teachers, check_tokenizers
from rl_runtime.step.collate import CollatedBatch
from tests.app_loading import app_main, assert_planned, run_in_process

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "distill"
CONFIG = APP / "configs" / "cpu_default.yaml"


def test_teachers_cover_rows_by_tag_and_a_teacher_without_tags_covers_all():
    plan = build_teachers({"math": {"model": "m", "tags": ["gsm8k", "math"], "kl_coef": 0.5},
                           "all": {"model": "r", "kl_coef": 2}}, (0,))  # fmt: skip
    assert plan.coefs(["code", "math", "gsm8k"]).tolist() == [[0, 0.5, 0.5], [2, 2, 2]]
    assert [t.role for t in plan.teachers] == ["teacher_math", "teacher_all"]
    only = build_teachers({"math": {"model": "m", "tags": ["math"]}}, (0,))
    with pytest.raises(ValueError, match=r"no teacher teaches rows tagged \['code'\]"):
        only.coefs(["math", "code"])


@pytest.mark.parametrize(
    "teachers, match",
    [
        ({}, "at least one teacher"),
        ({"a": {"model": "m", "typo": 1}}, r"teachers\.a: unknown key\(s\) \['typo'\]"),
        ({"a": {"tags": ["x"]}}, r"teachers\.a\.model"),
        ({"a": {"model": "m", "tags": "x"}}, r"teachers\.a\.tags"),
        ({"a": {"model": "m", "kl_coef": -1}}, r"teachers\.a\.kl_coef"),
        ({"a": {"model": "m", "dtype": "int8"}}, r"teachers\.a\.dtype"),
        ({"a": {"model": "m", "device_mapping": "list(range(0,x))"}}, r"teachers\.a\.device_mapping"),
    ],
)  # fmt: skip
def test_teacher_config_errors_name_the_key(teachers, match):
    with pytest.raises(ValueError, match=match):
        build_teachers(teachers, (0,))


class _ScoringCtx:
    """A driver context whose teacher roles answer constant log-probs and record which rows
    each scored: what decides here is which teacher scores which row, not the model."""

    def __init__(self) -> None:
        self.scored: dict[str, list[int]] = {}

    def forward(self, role: str, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.scored[role] = t["input_ids"][:, 0].tolist()
        value = {"teacher_a": -1.0, "teacher_b": -2.0}[role]
        return {"log_probs": torch.full(t["input_ids"].shape, value)}


def _batch(tags: list[str]) -> CollatedBatch:
    b = len(tags)
    ids = torch.arange(b)[:, None].repeat(1, 3)  # row r's first token is r
    tensors = {"input_ids": ids, "rollout_log_probs": torch.zeros(b, 3)}
    return CollatedBatch(tensors, [str(i) for i in range(b)], tags, [str(i) for i in range(b)])


def test_routed_rows_are_scored_only_by_their_teacher():
    plan = build_teachers({"a": {"model": "m", "tags": ["x"], "kl_coef": 2.0},
                           "b": {"model": "n", "tags": ["y", "z"], "kl_coef": 0.5}}, (0,))  # fmt: skip
    ctx = _ScoringCtx()
    lp, coef = teacher_log_probs(ctx, _batch(["y", "x", "x", "z"]), plan)  # type: ignore[arg-type]
    assert ctx.scored == {"teacher_a": [1, 2], "teacher_b": [0, 3]}
    assert lp[:, 0].tolist() == [-2.0, -1.0, -1.0, -2.0]
    assert coef.tolist() == [0.5, 2.0, 2.0, 0.5]


def test_teachers_without_tags_average_on_every_row():
    plan = build_teachers({"a": {"model": "m", "kl_coef": 0.75},
                           "b": {"model": "n", "kl_coef": 0.25}}, (0,))  # fmt: skip
    ctx = _ScoringCtx()
    lp, coef = teacher_log_probs(ctx, _batch(["x", "y"]), plan)  # type: ignore[arg-type]
    assert ctx.scored == {"teacher_a": [0, 1], "teacher_b": [0, 1]}
    torch.testing.assert_close(lp, torch.full((2, 3), -1.25))  # 0.75 * -1 + 0.25 * -2
    torch.testing.assert_close(coef, torch.full((2,), 1.0))


@pytest.fixture(scope="module")
def two_tokenizers(tmp_path_factory):
    from rl_rollout.tiny_model import build_tiny_tokenizer

    root = tmp_path_factory.mktemp("tokenizers")
    dirs = {}
    for name, seed, size in (("student", 0, 512), ("same", 0, 512), ("other", 0, 400)):
        build_tiny_tokenizer(seed=seed, vocab_size=size).save_pretrained(root / name)
        dirs[name] = str(root / name)
    return dirs


def test_a_teacher_with_another_tokenizer_is_refused_naming_both_models(two_tokenizers):
    d = two_tokenizers
    same = build_teachers({"t": {"model": d["same"]}}, (0,))
    check_tokenizers(d["student"], same.teachers)  # equal: accepted
    other = build_teachers({"t": {"model": d["other"]}}, (0,))
    with pytest.raises(ValueError) as err:
        check_tokenizers(d["student"], other.teachers)
    msg = str(err.value)
    assert msg.startswith("teachers.t: the teacher's tokenizer") and "tokens" in msg
    assert d["other"] in msg and d["student"] in msg


def test_dry_run_plans_the_teacher_and_refuses_dynamic_sampling(capsys):
    main = app_main("distill")
    code = main(["--dry-run"])
    out, err = capsys.readouterr()
    assert_planned(code, err)
    assert "TeacherPlan(name='arith'" in out
    assert "warning:" not in out
    code = main(["--dry-run", "dynamic_sampling.enable=true"])
    out, err = capsys.readouterr()
    assert "dynamic_sampling.enable: drops groups" in out + err


def test_off_policy_options_are_checked_by_name():
    from rl_runtime.pipelines.distill.off_policy import OffPolicyOptions

    assert OffPolicyOptions(source="data", files="a.jsonl, b.parquet").file_list == (
        "a.jsonl", "b.parquet")  # fmt: skip
    for kwargs, match in (({"source": "sft"}, "off_policy.source='sft'"),
                          ({"source": "data"}, "off_policy.files"),
                          ({"source": "teacher", "files": "a.jsonl"}, "off_policy.files"),
                          ({"source": "teacher", "steps": 0}, "off_policy.steps=0")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            OffPolicyOptions(**kwargs)


def test_off_policy_given_rows_train_on_the_response_and_teacher_samples_end_in_eos(tmp_path):
    """Given prompt/response rows go through rl_runtime.step.sft_data (the response trained on,
    the prompt not); the teacher's samples keep the prompt's token ids and train on what the
    teacher generated, up to its eos."""
    from transformers import AutoTokenizer

    from rl_rollout.tiny_model import default_tiny_model_dir
    from rl_runtime.pipelines.distill.off_policy import (
        OffPolicyOptions,
        given_examples,
        teacher_examples,
    )

    model = str(default_tiny_model_dir())
    tok = AutoTokenizer.from_pretrained(model)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"instruction": "max 3 8 1 5 =", "output": "#### 8"}\n')
    opts = OffPolicyOptions(source="data", files=str(rows))
    (example,), counts = given_examples(opts, tok)
    assert counts["rows"] == 1
    trained = [i for i, m in zip(example.token_ids, example.loss_mask, strict=True) if m]
    assert "#### 8" in tok.decode(trained) and "max" not in tok.decode(trained)
    prompt = tok("max 3 8 1 5 =")["input_ids"]
    opts = OffPolicyOptions(source="teacher", samples_per_prompt=3, temperature=1.0)
    samples = teacher_examples(opts, model, [prompt, prompt[:3]], tok, 6, seed=0)
    assert len(samples) == 6
    for e in samples:
        p = e.loss_mask.index(True)
        assert list(e.token_ids[:p]) in (prompt, prompt[:3]) and all(e.loss_mask[p:])
        n = len(e.token_ids) - p
        assert 1 <= n <= 6 and (n == 6 or e.token_ids[-1] == tok.eos_token_id)


def test_a_built_teacher_is_reused_rebuilt_on_other_options_and_never_over_a_foreign_dir(tmp_path):
    from rl_runtime.cli.app_options import TinyModelOptions
    from rl_runtime.pipelines.distill.teacher_build import TeacherBuildOptions, build_teacher
    from rl_runtime.step.sft_data import SFTExample

    small = TinyModelOptions(hidden_size=64, num_layers=1, num_heads=1, intermediate_size=64)

    made: list[int] = []

    def examples(tok):
        made.append(1)
        ids = tok("max 3 8 =#### 8")["input_ids"]
        return [SFTExample(tuple(ids), tuple([False] * 4 + [True] * (len(ids) - 4)))] * 3

    opts = TeacherBuildOptions(out_dir=str(tmp_path / "t"), tiny_model=small, steps=2, batch_size=2)
    first = build_teacher(opts, examples, {"seed": 0})
    assert first["teacher_build/loss"] > 0 and (tmp_path / "t" / "distill_teacher.json").is_file()
    assert build_teacher(opts, examples, {"seed": 0}) == {} and len(made) == 1  # reused
    assert build_teacher(opts, examples, {"seed": 1}) and len(made) == 2  # rebuilt
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "weights.bin").write_text("x")
    foreign = TeacherBuildOptions(out_dir=str(tmp_path / "mine"), steps=1)
    with pytest.raises(ValueError, match="is not a teacher this app built"):
        build_teacher(foreign, examples, {"seed": 0})
    assert (tmp_path / "mine" / "weights.bin").read_text() == "x"


OPD = ROOT / "packages/rl-config/tests/data/roll/head/examples/qwen3-8B-onpolicy-distill-megatron"


@pytest.mark.parametrize(
    "name, teachers, nodes",
    [("onpolicy_distill_config.yaml", ["default"], 2),
     ("multi_teacher_onpolicy_distill_config.yaml", ["teacher_32B", "teacher_14B"], 4)],
)  # fmt: skip
def test_converted_roll_opd_examples_dry_run_with_paths_changed(
    name, teachers, nodes, tmp_path, capsys
):
    """ROLL's Megatron on-policy distillation examples, converted (`rl-config convert`), dry-run
    through apps/distill once models, data and devices are this host's: local models and data,
    the node count the examples' device ids need (ROLL's files say 1 node for 16 and 32
    devices), micro-batches that divide a step. Only the placement (16 or 32 devices) is left."""
    from rl_config.convert import convert_file, dump
    from rl_envs.tasks.arith import write_arith_parquet
    from rl_rollout.tiny_model import default_tiny_model_dir

    out = tmp_path / "converted.yaml"
    out.write_text(dump(convert_file(OPD / name, "fsdp2"), str(OPD / name), "fsdp2"))
    write_arith_parquet(str(tmp_path / "data"), kind="max", val_fraction=0.3, seed=0)
    model = default_tiny_model_dir()
    changed = [f"pretrain={model}", f"num_nodes={nodes}", "~system_envs.USE_MODELSCOPE",
               "actor_train.training_args.per_device_train_batch_size=4",
               f"actor_train.data_args.file_name=[{tmp_path}/data/train.parquet]",
               f"validation.data_args.file_name=[{tmp_path}/data/test.parquet]",
               "actor_train.data_args.messages=prompt",
               *(f"distill_app.teachers.{t}.model={model}" for t in teachers)]  # fmt: skip
    code = app_main("distill")(["--config", str(out), "--dry-run", *changed])
    stdout, err = capsys.readouterr()
    assert_planned(code, err)
    assert err.count("\n  - ") == 1 and "placement:" in err  # only the devices are missing
    for t in teachers:
        assert f"teacher_{t} strategy=fsdp2_train" in stdout


OFFLINE = (ROOT / "packages/rl-config/tests/data/roll/head/examples/qwen2.5-7B-distill_megatron"
           / "distill_megatron.yaml")  # fmt: skip


def test_roll_offline_distill_example_is_refused_by_name_then_dry_runs_converted(tmp_path, capsys):
    """ROLL's offline (token-level KL) distillation example: refused as it is with one message
    naming the pipeline and the command; converted (`rl-config convert`) it is apps/distill's
    mode off_policy with loss kd and ROLL's distill keys and batch (8 per device x 4 accumulated
    x 1 data-parallel rank of 8 devices at tensor 2 x pipeline 2 x context 2), and it dry-runs
    with only models, data and devices changed."""
    from rl_config.convert import convert_file, dump
    from rl_envs.tasks.arith import write_arith_parquet
    from rl_rollout.tiny_model import default_tiny_model_dir

    with pytest.raises(ConfigError) as info:
        load_config(OFFLINE)
    (issue,) = info.value.issues
    assert issue.path == "student" and "offline distillation" in issue.message
    assert "rl-config convert" in issue.message and "apps/distill" in issue.message
    conversion = convert_file(OFFLINE, "fsdp2")
    app = conversion.data["distill_app"]
    assert app["mode"] == "off_policy" and app["teachers"]["default"]["model"] == (
        "Qwen/Qwen2.5-14B-Instruct"
    )
    off = app["off_policy"]
    assert (off["loss"], off["kd_objective"], off["logits_topk"], off["distill_loss_weight"]) == (
        "kd", "forward_kl", 64, 0.85)  # fmt: skip
    assert (off["prompt_key"], off["response_key"], off["batch_size"]) == (
        "question_zh", "answer_zh", 32)  # fmt: skip
    assert conversion.data["pretrain"] == "Qwen/Qwen2.5-7B-Instruct"
    assert "student" not in conversion.data and "teacher" not in conversion.data
    out = tmp_path / "converted.yaml"
    out.write_text(dump(conversion, str(OFFLINE), "fsdp2"))
    write_arith_parquet(str(tmp_path / "data"), kind="max", val_fraction=0.3, seed=0)
    rows = [{"question_zh": f"{i} + 1 = ?", "answer_zh": f"{i + 1}"} for i in range(40)]
    (tmp_path / "kd.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = default_tiny_model_dir()
    changed = [f"pretrain={model}", f"distill_app.teachers.default.model={model}",
               "actor_train.device_mapping=list(range(0,1))",
               "distill_app.teachers.default.device_mapping=list(range(0,1))",
               f"actor_train.data_args.file_name=[{tmp_path}/data/train.parquet]",
               f"validation.data_args.file_name=[{tmp_path}/data/test.parquet]",
               "actor_train.data_args.messages=prompt",
               f"distill_app.off_policy.files={tmp_path}/kd.jsonl"]  # fmt: skip
    code = app_main("distill")(["--config", str(out), "--dry-run", *changed])
    stdout, err = capsys.readouterr()
    assert_planned(code, err)
    assert "teacher_default strategy=fsdp2_train" in stdout
    assert "mode: off_policy (each step: 32 rows, loss kd)" in stdout


def test_off_policy_options_refuse_what_they_do_not_read():
    from rl_app_distill.options import AppOptions

    from rl_runtime.pipelines.distill.off_policy import OffPolicyOptions

    with pytest.raises(ValueError, match="off_policy.kd_objective='reverse_kl': read with loss kd"):
        OffPolicyOptions(kd_objective="reverse_kl")
    with pytest.raises(ValueError, match="off_policy.kd_objective='tv'"):
        OffPolicyOptions(loss="kd", kd_objective="tv")
    with pytest.raises(ValueError, match="set distill_app.mode: off_policy"):
        AppOptions(off_policy=OffPolicyOptions(source="teacher", loss="kd"))
    with pytest.raises(ValueError, match="mode off_policy trains on its rows"):
        AppOptions(mode="off_policy")
    with pytest.raises(ValueError, match="off_policy.steps=10: read in mode on_policy only"):
        AppOptions(mode="off_policy", off_policy=OffPolicyOptions(source="teacher", steps=10))


@pytest.mark.slow
def test_distill_two_steps_end_to_end(tmp_path):
    """The teacher is built, the student is trained off-policy on its samples, then two
    on-policy steps in-process: every sampled token is scored by the teacher, the student
    trains on the negated reverse KL and syncs; held-out accuracy before and after."""
    out = tmp_path / "run"
    args = {
        "output_dir": out, "logging_dir": out / "logs", "checkpoint_config.output_dir": out / "ckpt",
        "pretrain": tmp_path / "student", "distill_app.build_tiny_model": tmp_path / "student",
        "distill_app.teacher_build.out_dir": tmp_path / "teacher",
        "distill_app.teachers.arith.model": tmp_path / "teacher",
        "distill_app.teacher_build.steps": 3, "track_with": "stdout", "max_steps": 2,
        "eval_steps": 2, "save_steps": 1000, "rollout_batch_size": 4,
        "num_return_sequences_in_group": 4, "val_batch_size": 8, "val_n_sample": 2,
        "actor_train.training_args.per_device_train_batch_size": 8,
        "actor_train.training_args.gradient_accumulation_steps": 2,
        # off-policy first: SFT on the teacher's samples of 8 prompts (replaces the warm-up)
        "distill_app.warmup.steps": 0, "distill_app.off_policy.source": "teacher",
        "distill_app.off_policy.max_prompts": 8, "distill_app.off_policy.steps": 2,
        "distill_app.off_policy.batch_size": 8,
    }  # fmt: skip
    argv = ["--no-ray", *(f"{k}={v}" for k, v in args.items())]
    proc = run_in_process("distill", argv, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert (tmp_path / "teacher" / "distill_teacher.json").is_file()
    assert "warm-up 2/2" in proc.stdout  # the off-policy SFT steps
    rows = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0 and "distill/reverse_kl" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert math.isfinite(r["distill/reverse_kl"]) and math.isfinite(r["train/grad_norm"])
        assert r["distill/teacher_log_prob"] < 0 and r["rollout/num_trajectories"] == 16
        assert r["sync/weight_version"] == r["step"] + 1
    summary = json.loads((out / "summary.json").read_text())
    for part in ("eval_before", "eval_after"):
        assert summary[part]["val/num_prompts"] == 8


@pytest.mark.slow
def test_distill_off_policy_kd_two_steps_end_to_end(tmp_path):
    """Mode off_policy with loss kd, in-process: the teacher is built and samples the training
    prompts, then two steps each score a batch with the teacher's top-k and train the student on
    the forward KL (plus the NLL) to it; held-out accuracy before and after."""
    out = tmp_path / "run"
    args = {
        "output_dir": out, "logging_dir": out / "logs", "checkpoint_config.output_dir": out / "ckpt",
        "pretrain": tmp_path / "student", "distill_app.build_tiny_model": tmp_path / "student",
        "distill_app.teacher_build.out_dir": tmp_path / "teacher",
        "distill_app.teachers.arith.model": tmp_path / "teacher",
        "distill_app.teacher_build.steps": 3, "distill_app.warmup.steps": 0,
        "track_with": "stdout", "max_steps": 2, "eval_steps": 2, "save_steps": 1000,
        "val_batch_size": 8, "val_n_sample": 2,
        "distill_app.mode": "off_policy", "distill_app.off_policy.source": "teacher",
        "distill_app.off_policy.loss": "kd", "distill_app.off_policy.max_prompts": 16,
        "distill_app.off_policy.batch_size": 8, "distill_app.off_policy.logits_topk": 16,
        "distill_app.off_policy.kd_objective": "reverse_kl",
    }  # fmt: skip
    argv = ["--no-ray", *(f"{k}={v}" for k, v in args.items())]
    proc = run_in_process("distill", argv, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0 and "distill/forward_kl" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["distill/rows"] == 8 and r["distill/tokens"] > 0
        assert r["distill/forward_kl"] > 0 and r["distill/reverse_kl"] > 0
        # reverse_kl is the objective: the trained divergence is the reverse KL
        assert r["distill/kd_loss"] == pytest.approx(r["distill/reverse_kl"], rel=1e-4)
        assert math.isfinite(r["train/grad_norm"])
    assert steps[1]["sync/weight_version"] == steps[0]["sync/weight_version"] + 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_after"]["val/num_prompts"] == 8
    assert (out / "curves.png").is_file()
