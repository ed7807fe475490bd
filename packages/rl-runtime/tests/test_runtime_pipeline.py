"""rl_runtime.run.runner.Runner with a fake recipe and in-process fake workers: cadence (the last
step logs, evaluates and saves), teardown after an exception, summary.json and the resolved
config, skipped steps, signals, where the outputs went, refusals without Ray."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from runtime_fakes import FakeRecipe, _logged_steps, _run, _runner

from rl_config.errors import ConfigError
from rl_config.schema import ExperimentConfig
from rl_runtime.compose import compose


def test_cadence_summary_and_resolved_config(tmp_path):
    recipe = FakeRecipe()
    _, result = _run(tmp_path, recipe)
    evals = [s for kind, s in recipe.calls if kind == "eval"]
    assert evals == [0, 2, 4, 5]  # before training, every eval_steps, and the last step
    assert _logged_steps(tmp_path) == [2, 4, 5]  # logging_steps 2, and the last step
    ckpts = sorted(p.name for p in (tmp_path / "out" / "checkpoints").iterdir())
    assert ckpts == ["step-000003", "step-000005"]  # save_steps 3, and the last step
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["step"] == 5 and summary["weight_version"] == 5
    assert summary["eval_before"] == {"val/success_rate": 0.0}
    assert summary["eval_after"] == {"val/success_rate": 0.5}
    assert (tmp_path / "out" / "resolved_config.yaml").exists()
    assert result.resumed_from is None


def test_eval_steps_zero_never_evaluates(tmp_path):
    """`eval_steps: 0` means never (the schema's promise): not before training, not at the
    last step; the summary has no evaluation to report."""
    recipe = FakeRecipe()
    _run(tmp_path, recipe, eval_steps=0)
    assert [s for kind, s in recipe.calls if kind == "eval"] == []
    assert [s for kind, s in recipe.calls if kind == "step"] == [0, 1, 2, 3, 4]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["eval_before"] == {} and summary["eval_after"] == {}


def test_teardown_after_an_exception(tmp_path):
    runner = _runner(tmp_path, FakeRecipe(fail_at=2))
    seen = {}
    original = runner.teardown

    def teardown() -> None:
        seen["cluster"], seen["tracker"] = runner.ctx.cluster, runner.ctx.tracker
        original()

    runner.teardown = teardown
    with pytest.raises(RuntimeError, match="boom"):
        runner.run()
    assert runner.ctx is None and seen["cluster"].groups == {}  # workers shut down
    assert seen["tracker"].backends == []  # the tracker was closed
    assert _logged_steps(tmp_path) == [2]  # the third step failed; step 2 was logged


class SummarisingRecipe(FakeRecipe):
    """Evaluates to success 0 before training and 1 after (a gain with a standard error of 0,
    `gain_in_se` inf) and reports a NaN figure."""

    def evaluate(self, ctx) -> dict[str, float]:
        return {"val/success_rate": float(ctx.step > 0), "val/reward": float("nan")}

    def summary(self, before: dict, after: dict) -> dict:
        from rl_runtime.pipelines.agentic.gain import success_gains

        return success_gains(before, after, ("val/success_rate",), n=8)


def test_summary_json_is_standard_json_with_null_for_non_finite_figures(tmp_path):
    """summary.json held `Infinity` (a 0 -> 1 gain's gain_in_se) and `NaN`, which JSON does not
    have: jq and JavaScript refuse the file. Now they are null; the finite figures stay."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not standard JSON: {constant}")

    _, result = _run(tmp_path, SummarisingRecipe())
    assert result.summary["gain val/success_rate"]["gain_in_se"] == float("inf")
    text = (tmp_path / "out" / "summary.json").read_text()
    summary = json.loads(text, parse_constant=refuse)
    assert summary["summary"]["gain val/success_rate"] == {
        "gain": 1.0, "se": 0.0, "gain_in_se": None, "n": 8
    }  # fmt: skip
    assert summary["eval_after"] == {"val/success_rate": 1.0, "val/reward": None}
    assert not list((tmp_path / "out").glob("*.tmp"))


class RecipeWithBaselines(FakeRecipe):
    def baselines(self, ctx) -> dict:
        return {"blind": {"val/success_rate": 0.125}}

    def summary(self, before: dict, after: dict) -> dict:
        return {"gain": after["val/success_rate"] - before["val/success_rate"]}


def test_baselines_and_summary_reach_summary_json_and_the_table(tmp_path, capsys):
    from rl_runtime.run.report import print_result

    _, result = _run(tmp_path, RecipeWithBaselines())
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["baselines"] == {"blind": {"val/success_rate": 0.125}}
    assert summary["summary"] == {"gain": 0.5}
    # without a terminal (pytest captures stderr) every step prints one line with its phases
    assert "step 5/5 |" in capsys.readouterr().out
    print_result(result, "t", lambda m: {"success": m["val/success_rate"]}, before_label="warm")
    table = capsys.readouterr().out
    assert table.index("blind") < table.index("warm") < table.index("after RL")
    assert "0.125" in table and "gain: 0.5" in table


def _two_device_config(**roles: list[int]) -> ExperimentConfig:
    mapped = {role: {"device_mapping": devices} for role, devices in roles.items()}
    return ExperimentConfig.model_validate({
        "pretrain": "tiny", "num_gpus_per_node": 2, "rollout_batch_size": 4,
        "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["FL"]},
        "val_env_manager": {"num_env_groups": 2, "group_size": 1, "tags": ["FL"]},
        "custom_envs": {"FL": {"env_type": "frozen_lake", "max_steps": 4}},
        **mapped,
    })  # fmt: skip


def test_without_ray_a_training_role_of_several_ranks_is_refused_by_name():
    """--no-ray puts every worker in one process: a 2-rank actor_train used to wait for its
    second rank until rpc_timeout (900 s in the CPU defaults), then fail with a hint to raise it."""
    from rl_runtime.run.checks import check_in_process

    two_ranks = compose(_two_device_config(actor_train=[0, 1], actor_infer=[0]))
    with pytest.raises(ConfigError, match=r"actor_train\.device_mapping: 2 ranks") as err:
        check_in_process(two_ranks, use_ray=False)
    assert "actor_infer" not in str(err.value)
    check_in_process(two_ranks, use_ray=True)  # Ray gives each rank its own process
    # rollout workers hold no process group: two engines in one process are fine
    check_in_process(compose(_two_device_config(actor_train=[0], actor_infer=[0, 1])), False)


def test_without_ray_partial_rollout_is_refused_by_name_before_anything_starts():
    """`async.partial_rollout` with --no-ray was refused only when asynchronous training
    started, after the warm-up and the pre-RL evaluation, as a traceback."""
    from rl_runtime.run.checks import check_in_process

    cfg = _two_device_config(actor_train=[0], actor_infer=[1])
    data = {**cfg.model_dump(exclude_unset=True), "async": {"max_staleness": 1}}
    partial = compose(ExperimentConfig.model_validate(
        {**data, "async": {"max_staleness": 1, "partial_rollout": True}}))  # fmt: skip
    with pytest.raises(ConfigError, match=r"async\.partial_rollout: needs Ray"):
        check_in_process(partial, use_ray=False)
    check_in_process(partial, use_ray=True)
    check_in_process(compose(ExperimentConfig.model_validate(data)), use_ray=False)


def test_without_ray_the_keys_only_ray_reads_are_warned_about_by_name():
    from rl_runtime.run.checks import check_in_process

    cfg = _two_device_config(actor_train=[0], actor_infer=[1])
    assert check_in_process(compose(cfg), use_ray=False) == []
    pinned = ExperimentConfig.model_validate({
        **cfg.model_dump(exclude_unset=True), "num_gpus_per_node": 1, "num_nodes": 2,
        "node_resources": ["trainer_node", "rollout_node"], "weight_sync_host": "10.0.0.5",
    })  # fmt: skip
    warnings = check_in_process(compose(pinned), use_ray=False)
    assert len(warnings) == 2
    assert warnings[0].startswith("node_resources=('trainer_node', 'rollout_node') has no effect")
    assert warnings[1].startswith("weight_sync_host='10.0.0.5' has no effect without Ray")
    assert check_in_process(compose(pinned), use_ray=True) == []
    data = cfg.model_dump(exclude_unset=True)
    for mb, expected in (
        (64, ["model_update_buffer_size_mb=64 has no effect without Ray"]),
        (1024, []),
    ):  # fmt: skip  (1024: the default)
        sized = ExperimentConfig.model_validate({**data, "model_update_buffer_size_mb": mb})
        found = check_in_process(compose(sized), use_ray=False)
        assert [w.split(" (--no-ray)")[0] for w in found] == expected
        assert check_in_process(compose(sized), use_ray=True) == []


class SkippingRecipe(FakeRecipe):
    """Dynamic sampling kept no group at the steps in `skip` (`None`: every step)."""

    def __init__(self, skip: set[int] | None = None) -> None:
        super().__init__()
        self.skip = skip

    def step(self, ctx) -> dict[str, float]:
        if self.skip is None or ctx.step in self.skip:
            return {"train/skipped": 1.0, "dynamic_sampling/kept_groups": 0.0}
        return super().step(ctx)


def test_a_step_that_kept_no_group_says_skipped_and_is_counted(tmp_path, capsys):
    from rl_runtime.run.report import print_result

    _, result = _run(tmp_path, SkippingRecipe({1, 3}))
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.startswith("step ") and "/5 |" in x]
    assert len(lines) == 5
    assert [("skipped (no group kept)" in x) for x in lines] == [False, True, False, True, False]
    assert result.skipped_steps == 2
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["skipped_steps"] == 2 and summary["step"] == 5
    print_result(result, "t", lambda m: m)
    assert "skipped steps: 2 of 5 trained on nothing" in capsys.readouterr().out


def test_skipped_steps_are_the_whole_runs_across_a_resume(tmp_path):
    _run(tmp_path, SkippingRecipe({0}), max_steps=3)
    _, result = _run(tmp_path, SkippingRecipe({4}), max_steps=5, resume_from_checkpoint=True)
    assert result.skipped_steps == 2  # one before the checkpoint at step 3, one after


def test_a_run_that_trained_on_nothing_ends_with_an_error(tmp_path):
    from rl_runtime.run.report import NothingTrainedError

    with pytest.raises(NothingTrainedError, match="every one of the run's 5 steps was skipped"):
        _run(tmp_path, SkippingRecipe())
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["skipped_steps"] == 5  # the summary says so too


class SignalledRecipe(FakeRecipe):
    """Sends `signum` to its own process at step `at` (the driver's main thread handles it)."""

    def __init__(self, signum: int, at: int) -> None:
        super().__init__()
        self.signum, self.at = signum, at

    def step(self, ctx) -> dict[str, float]:
        if ctx.step == self.at:
            os.kill(os.getpid(), self.signum)
            time.sleep(5)  # the handler raises before this ends
        return super().step(ctx)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_the_run_in_order_with_the_last_durable_checkpoint(tmp_path, signum, code):
    from rl_runtime.run import interrupts
    from rl_runtime.run.interrupts import RunInterrupted

    monkey_command = ("uv", "run", "apps/x", "max_steps=5", "resume_from_checkpoint=false")
    interrupts._command = monkey_command
    try:
        runner = _runner(tmp_path, SignalledRecipe(signum, at=4))  # saved at step 3
        before = signal.getsignal(signum)
        with pytest.raises(RunInterrupted) as info:
            runner.run()
    finally:
        interrupts._command = None
    exc = info.value
    assert exc.exit_code == code and runner.ctx is None  # workers stopped
    assert signal.getsignal(signum) is before  # the handler was put back
    ckpt = str(tmp_path / "out" / "checkpoints" / "step-000003")
    assert exc.step == 4 and exc.checkpoint == ckpt
    assert exc.resume_command == f"uv run apps/x max_steps=5 resume_from_checkpoint={ckpt}"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["interrupted"] == signal.Signals(signum).name and summary["step"] == 4
    assert summary["last_checkpoint"] == ckpt and summary["resume_command"] == exc.resume_command
    report = exc.report()
    assert f"last durable checkpoint: {ckpt}" in report and "resume with: uv run" in report


def test_the_last_line_and_summary_say_where_everything_went(tmp_path, capsys, monkeypatch):
    """The run's last line lists where checkpoints, logs, TensorBoard, curves, summary and the
    exported model went (before: curves and hf_model only); summary.json records them. The
    model is exported from the last checkpoint (rl_runtime.cli.export, what `rl-export` runs; the
    fake trainer's checkpoints hold no model, so a stand-in writes it)."""
    from rl_runtime.run.report import print_result

    exported = []

    def export_checkpoint(checkpoint, out_dir, **_):
        exported.append(checkpoint)
        Path(out_dir).mkdir(parents=True)
        return Path(out_dir)

    monkeypatch.setattr("rl_runtime.cli.export.export_checkpoint", export_checkpoint)
    out = tmp_path / "out"
    _, result = _run(tmp_path, FakeRecipe(), {"export_hf": True}, max_steps=2)
    assert exported == [str(out / "checkpoints" / "step-000002")]
    capsys.readouterr()
    print_result(result, "t", lambda m: m)
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == (
        f"outputs: checkpoints={out / 'checkpoints'} logs={out / 'logs'} tensorboard=not tracked "
        f"curves={out / 'curves.png'} summary={out / 'summary.json'} hf_model={out / 'hf_model'}"
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outputs"]["checkpoints"] == str(out / "checkpoints")


def test_a_key_named_by_the_config_is_hidden_from_sandboxed_calls(tmp_path, monkeypatch):
    """Only `$RL_CHECKPOINT_KEY_FILE` and the default location were hidden: a key named by
    `checkpoint_config.key_file` was readable by a non-root call. The run now passes it to the
    sandbox pools of the driver and of every worker (`RL_SANDBOX_HIDE`)."""
    from rl_envs.sandbox.credentials import HIDE_VARIABLE, secret_paths
    from rl_runtime.run.checks import sandbox_hidden_env

    monkeypatch.delenv(HIDE_VARIABLE, raising=False)
    monkeypatch.setenv(HIDE_VARIABLE, "")  # restored after the test
    key = tmp_path / "keys" / "run.key"
    _run(tmp_path, FakeRecipe(), max_steps=1, checkpoint_config={"key_file": str(key)})
    assert key.exists()
    assert str(key) in sandbox_hidden_env()[HIDE_VARIABLE].split(os.pathsep)
    assert str(key) in secret_paths()
