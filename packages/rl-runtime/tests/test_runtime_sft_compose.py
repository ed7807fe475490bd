"""The SFT plan of a config: ROLL's step count (num_train_epochs x rows // rows per step) unless
max_steps is set (then epochs set beside it are warned about), the batch, packing, the held-out
template, and the run checkpointing actor_train although its plan has no configured loss."""

from pathlib import Path

from rl_config.loading import compose_config
from rl_config.schema import ExperimentConfig
from rl_runtime.pipelines.sft.compose import compose_sft

CONFIG = Path(__file__).resolve().parents[3] / "apps" / "sft" / "configs" / "cpu_default.yaml"


def _cfg(**top):
    data = dict(compose_config(CONFIG, []).data)
    data.pop("sft_app")
    data["sft_train"]["training_args"]["num_train_epochs"] = top.pop("epochs", 1)
    return ExperimentConfig.model_validate({**data, **top})


def test_steps_follow_roll_epochs_times_rows_over_the_batch():
    c = compose_sft(_cfg(epochs=3), train_rows=100)  # 16 rows per step
    assert c.cadence.max_steps == 3 * 100 // 16 == 18
    assert c.roles[0].training_args.max_steps == 18
    assert c.sft.examples_per_step == 16 and c.sft.packed
    assert compose_sft(_cfg(), train_rows=5).cadence.max_steps == 1  # at least one step


def test_max_steps_set_wins_and_epochs_beside_it_are_warned():
    c = compose_sft(_cfg(epochs=2, max_steps=7), train_rows=100)
    assert c.cadence.max_steps == 7
    assert any("num_train_epochs=2 has no effect: max_steps=7" in w for w in c.warnings)
    assert compose_sft(_cfg(max_steps=7), train_rows=None).cadence.max_steps == 7


def test_held_out_rows_take_validation_s_template():
    cfg = _cfg(validation={"data_args": {"file_name": "v.jsonl", "template": "qwen2_5"}})
    c = compose_sft(cfg, train_rows=32)
    assert c.sft.eval_files == ("v.jsonl",)
    assert c.sft.fields.template == "native" and c.sft.eval_fields.template == "qwen2_5"
    assert compose_sft(_cfg(global_template="qwen3"), train_rows=32).sft.fields.template == "qwen3"


def test_actor_train_without_a_configured_loss_is_checkpointed():
    from rl_runtime.run.runner import Runner

    c = compose_sft(_cfg(), train_rows=32)
    assert c.roles[0].loss is None  # it trains with the "sft" loss
    runner = Runner.__new__(Runner)
    runner.components = c
    assert runner._optimizer_roles() == ["actor_train"]
