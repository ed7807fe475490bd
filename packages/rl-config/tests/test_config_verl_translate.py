"""The verl translation (``--verl``): each semantic rule with hand-derived values, the walk over
verl's own key set, the asynchronous recipes, refusals by name, and ``rl-config convert --from
verl``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rl_config.cli import main as cli_main
from rl_config.errors import ConfigError
from rl_config.loading import load_app_config
from rl_config.verl_rules import rule_for
from rl_config.verl_translate import VERL_DEFAULTS, translate

DATA = Path(__file__).parent / "data"
KEYS = yaml.safe_load((DATA / "verl_ppo_trainer_keys.yaml").read_text())
A = "actor_rollout_ref"
ONE_STEP_OFF = "recipe.one_step_off_policy.main_ppo"
FULLY_ASYNC = "recipe.fully_async_policy.fully_async_main"

# the keys every translated command below needs (verl requires them too)
BASE = [
    "data.train_files=/data/train.parquet",
    "data.val_files=/data/test.parquet",
    f"{A}.model.path=/models/policy",
    f"{A}.rollout.name=vllm",
    f"{A}.rollout.tensor_model_parallel_size=1",
    f"{A}.actor.ppo_micro_batch_size_per_gpu=4",
    "algorithm.adv_estimator=grpo",
    "trainer.total_training_steps=3",
    "trainer.n_gpus_per_node=1",
    "data.train_batch_size=16",
    f"{A}.actor.ppo_mini_batch_size=8",
]

NO_STEPS = [o for o in BASE if "total_training_steps" not in o]


def _t(*overrides: str, entry: str = "verl.trainer.main_ppo", rows: int = 1000):
    return translate([*BASE, *overrides], entry=entry, count_rows=lambda _path: rows)


def _get(data: dict, key: str):
    for part in key.split("."):
        data = data[part]
    return data


def _ok(*overrides: str, **kw) -> dict:
    t = _t(*overrides, **kw)
    assert t.refused == [], t.refused
    return t.data


def _refused(*overrides: str, **kw) -> dict[str, str]:
    return {i.path: i.message for i in _t(*overrides, **kw).refused}


def _overrides(keys: dict) -> list[str]:
    dump = lambda v: yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...")  # noqa: E731
    return [f"{k}={dump(v).strip()}" for k, v in keys.items()]


def test_batch_arithmetic_prompts_samples_optimizer_steps_and_micro_batches():
    """128 prompts x n=5 = 640 samples a step; a mini-batch of 64 prompts is 320 samples, over 2
    ranks 160 a rank: micro 20 -> 8 accumulation steps, 2 optimizer steps per step."""
    d = _ok(
        "data.train_batch_size=128",
        f"{A}.rollout.n=5",
        f"{A}.actor.ppo_mini_batch_size=64",
        f"{A}.actor.ppo_micro_batch_size_per_gpu=20",
        "trainer.n_gpus_per_node=2",
    )
    assert d["rollout_batch_size"] == 128 and d["num_return_sequences_in_group"] == 5
    args = d["actor_train"]["training_args"]
    assert (args["per_device_train_batch_size"], args["gradient_accumulation_steps"]) == (20, 8)
    assert d["actor_train"]["device_mapping"] == d["actor_infer"]["device_mapping"]
    assert d["actor_train"]["device_mapping"] == "list(range(0,2))"
    # a micro-batch that does not divide a rank's 160 samples: the largest divisor below it (32)
    d = _ok(
        "data.train_batch_size=128",
        f"{A}.rollout.n=5",
        f"{A}.actor.ppo_mini_batch_size=64",
        f"{A}.actor.ppo_micro_batch_size_per_gpu=35",
        "trainer.n_gpus_per_node=2",
    )
    args = d["actor_train"]["training_args"]
    assert (args["per_device_train_batch_size"], args["gradient_accumulation_steps"]) == (32, 5)
    # verl's deprecated global micro-batch: 40 over 2 ranks = 20 per rank
    d = _ok(
        "data.train_batch_size=128",
        f"{A}.rollout.n=5",
        f"{A}.actor.ppo_mini_batch_size=64",
        f"{A}.actor.ppo_micro_batch_size=40",
        f"~{A}.actor.ppo_micro_batch_size_per_gpu",
        "trainer.n_gpus_per_node=2",
    )
    assert d["actor_train"]["training_args"]["per_device_train_batch_size"] == 20


def test_batch_refusals_name_the_key():
    bad = _refused("data.train_batch_size=128", f"{A}.actor.ppo_mini_batch_size=48")
    assert "does not divide the 128 prompts" in bad[f"{A}.actor.ppo_mini_batch_size"]
    bad = _refused(
        "data.train_batch_size=12", f"{A}.actor.ppo_mini_batch_size=3", "trainer.n_gpus_per_node=2"
    )
    assert "do not split over 2 ranks" in bad[f"{A}.actor.ppo_mini_batch_size"]
    bad = _refused(f"~{A}.actor.ppo_micro_batch_size_per_gpu")
    assert "required unless use_dynamic_bsz" in bad[f"{A}.actor.ppo_micro_batch_size_per_gpu"]
    # dynamic batching: a memory knob (token budget), the optimizer step is unchanged
    d = _ok(
        f"~{A}.actor.ppo_micro_batch_size_per_gpu",
        f"{A}.actor.use_dynamic_bsz=True",
        f"{A}.actor.ppo_max_token_len_per_gpu=4096",
        "data.train_batch_size=8",
        f"{A}.actor.ppo_mini_batch_size=4",
        f"{A}.rollout.n=2",
    )
    assert d["actor_train"]["use_dynamic_batching_in_train"] is True
    assert d["actor_train"]["max_tokens_per_microbatch_in_train"] == 4096
    args = d["actor_train"]["training_args"]
    assert args["per_device_train_batch_size"] * args["gradient_accumulation_steps"] == 8


def test_loss_as_verl_computes_it_and_nothing_the_command_did_not_ask_for():
    """verl's defaults: symmetric clip 0.2, dual-clip c=3, token-mean, no entropy, no KL loss, raw
    scores into GRPO (no extra normalisation), no warm-up, no dynamic sampling, no clip-higher."""
    d = _ok()
    assert (d["pg_clip"], d["use_pg_clip_range"]) == (0.2, False)
    assert (d["dual_clip_loss"], d["dual_clip_c"]) == (True, 3.0)
    assert d["loss_agg_mode"] == "token-mean" and d["entropy_loss_coef"] == 0.0
    assert d["use_kl_loss"] is False and "reference" not in d
    assert d["reward_normalization"]["method"] == "identity" and d["whiten_advantages"] is False
    assert d["dynamic_sampling"]["enable"] is False and d["overlong_penalty"]["enable"] is False
    assert d["actor_train"]["training_args"]["warmup_steps"] == 0
    assert "warmup" not in d.get("rlvr_app", {}) and "arith_data" not in d.get("rlvr_app", {})
    assert d["actor_train"]["training_args"]["learning_rate"] == 1e-6  # verl's default lr
    # clip-higher only when low != high; the KL loss with low_var_kl is k3
    d = _ok(
        f"{A}.actor.clip_ratio_low=0.2",
        f"{A}.actor.clip_ratio_high=0.28",
        f"{A}.actor.clip_ratio_c=10.0",
        f"{A}.actor.use_kl_loss=True",
        f"{A}.actor.kl_loss_coef=0.001",
        f"{A}.actor.kl_loss_type=low_var_kl",
        f"{A}.actor.entropy_coeff=0.001",
        f"{A}.actor.loss_agg_mode=seq-mean-token-mean",
    )
    assert (d["use_pg_clip_range"], d["pg_clip_low"], d["pg_clip_high"]) == (True, 0.2, 0.28)
    assert d["dual_clip_c"] == 10.0 and d["loss_agg_mode"] == "seq-mean-token-mean"
    assert (d["use_kl_loss"], d["kl_loss_coef"], d["kl_loss_type"]) == (True, 0.001, "k3")
    assert d["entropy_loss_coef"] == 0.001
    assert d["reference"]["device_mapping"] == d["actor_train"]["device_mapping"]


def test_advantages_kl_in_reward_and_critic():
    d = _ok("algorithm.norm_adv_by_std_in_grpo=False")
    assert d["adv_estimator"] == "dr_grpo"  # GRPO without the std division
    d = _ok("algorithm.use_kl_in_reward=True", "algorithm.kl_ctrl.kl_coef=0.01")
    assert (d["add_token_level_kl"], d["init_kl_coef"], d["adaptive_kl_ctrl"]) == (
        True,
        0.01,
        False,
    )
    assert "reference" in d
    d = _ok(
        "algorithm.use_kl_in_reward=True",
        "algorithm.kl_ctrl.type=adaptive",
        "algorithm.kl_ctrl.target_kl=0.05",
    )
    assert (d["adaptive_kl_ctrl"], d["target_kl"]) == (True, 0.05)
    # GAE: a critic (verl's default estimator), whitened advantages, gamma and lambda 1.0
    d = _ok(
        "algorithm.adv_estimator=gae",
        "critic.model.path=/models/critic",
        "critic.optim.lr=1e-5",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "data.train_batch_size=8",
        f"{A}.actor.ppo_mini_batch_size=4",
    )
    assert (d["adv_estimator"], d["whiten_advantages"], d["gamma"], d["lambd"]) == (
        "gae",
        True,
        1.0,
        1.0,
    )
    assert d["critic"]["model_args"]["model_name_or_path"] == "/models/critic"
    assert d["critic"]["training_args"]["learning_rate"] == 1e-5
    assert d["critic"]["training_args"]["per_device_train_batch_size"] == 2
    assert d["critic"]["training_args"]["gradient_accumulation_steps"] == 2  # 4 prompts / 2
    assert "critic.model.path" in _refused("algorithm.adv_estimator=gae")


def test_rollout_validation_device_and_cadence():
    d = _ok(
        f"{A}.rollout.name=hf",
        f"{A}.rollout.temperature=0.7",
        f"{A}.rollout.top_k=50",
        f"{A}.rollout.val_kwargs.do_sample=True",
        f"{A}.rollout.val_kwargs.n=4",
        f"{A}.rollout.val_kwargs.temperature=0.6",
        "trainer.device=npu",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=['console','tensorboard']",
    )
    assert d["actor_infer"]["strategy_args"]["strategy_name"] == "hf_infer"
    gen = d["actor_infer"]["generating_args"]
    assert (gen["temperature"], gen["top_k"], gen["num_return_sequences"]) == (0.7, 50, 1)
    val = d["validation"]["generating_args"]
    assert (val["do_sample"], val["temperature"], val["num_return_sequences"]) == (True, 0.6, 4)
    assert d["val_n_sample"] == 4
    assert d["system_envs"] == {"RL_DEVICE": "npu"}
    assert d["actor_train"]["model_args"]["dtype"] == "bf16"
    assert d["eval_steps"] == 0 and d["save_steps"] == 3  # -1: only the last step saves
    assert d["track_with"] == "tensorboard"
    offload = (
        f"{A}.actor.fsdp_config.param_offload=True",
        f"{A}.actor.use_kl_loss=True",
        f"{A}.ref.fsdp_config.param_offload=True",
    )
    d = _ok("trainer.device=cuda", *offload)
    assert d["actor_train"]["strategy_args"]["strategy_config"]["cpu_offload"] is True
    assert d["reference"]["strategy_args"]["strategy_config"]["offload_reference"] is True
    d = _ok("trainer.device=cpu", *offload)  # host memory already: no offload
    assert "cpu_offload" not in d["actor_train"]["strategy_args"]["strategy_config"]
    assert d["reference"]["strategy_args"]["strategy_config"]["offload_reference"] is False
    d = _ok("trainer.device=cpu", "trainer.test_freq=5")
    assert d["validation"]["generating_args"]["temperature"] == 0.0  # verl: greedy validation
    assert d["actor_train"]["model_args"]["dtype"] == "fp32" and d["eval_steps"] == 5
    assert "one of cpu, cuda, npu" in _refused("trainer.device=tpu")["trainer.device"]


def test_epochs_become_steps_by_the_row_count():
    """verl: steps = epochs x (rows // train_batch_size) (its dataloader drops the last batch)."""
    t = translate(
        [*NO_STEPS, "data.train_batch_size=16", "trainer.total_epochs=3"],
        count_rows=lambda path: {"/data/train.parquet": 100}.get(path, 7),
    )
    assert t.refused == [] and t.data["max_steps"] == 3 * (100 // 16)
    assert t.data["val_batch_size"] == 7  # verl validates on the whole held-out file
    t = translate([*NO_STEPS, "trainer.total_epochs=3"], count_rows=lambda path: None)
    assert "total_training_steps" in {i.path: i.message for i in t.refused}["trainer.total_epochs"]


def test_one_step_off_gives_rollout_its_own_devices_and_staleness_one():
    d = _ok(
        f"{A}.hybrid_engine=False",
        "trainer.n_gpus_per_node=3",
        "rollout.nnodes=1",
        "rollout.n_gpus_per_node=1",
        "data.train_batch_size=6",
        f"{A}.actor.ppo_mini_batch_size=6",
        f"{A}.actor.ppo_micro_batch_size_per_gpu=1",
        entry=ONE_STEP_OFF,
    )
    assert d["async"] == {"max_staleness": 1}
    assert (d["num_gpus_per_node"], d["actor_train"]["device_mapping"]) == (4, [0, 1, 2])
    assert d["actor_infer"]["device_mapping"] == [3]
    # the recipe uses the rollout log-probs as old log-probs: an IS weight old/rollout here
    assert d["train_infer_correction"]["is_weight"]["enabled"] is True
    assert "async_training.partial_rollout" in _refused(
        "async_training.partial_rollout=True", entry=ONE_STEP_OFF
    )


@pytest.mark.parametrize(
    "threshold, partial, staleness, expect_partial",
    [(0, True, 0, False), (0.5, True, 1, True), (0.5, False, 1, False), (2, True, 2, True)],
)
def test_fully_async_staleness_partial_rollout_and_its_step(
    threshold, partial, staleness, expect_partial
):
    """A step is one weight version: trigger_parameter_sync_step x require_batches x
    ppo_mini_batch_size prompts (train_batch_size is not read); staleness_threshold s rolls out
    up to s versions ahead (ceil(s)); partial rollout only when asynchronous (as in verl)."""
    d = _ok(
        f"async_training.staleness_threshold={threshold}",
        f"async_training.partial_rollout={partial}",
        "async_training.trigger_parameter_sync_step=4",
        "async_training.require_batches=2",
        f"{A}.actor.ppo_mini_batch_size=8",
        "data.train_batch_size=0",
        "rollout.total_rollout_steps=640",
        "~trainer.total_training_steps",
        "rollout.n_gpus_per_node=2",
        "trainer.n_gpus_per_node=2",
        entry=FULLY_ASYNC,
    )
    assert d["rollout_batch_size"] == 4 * 2 * 8
    assert d["max_steps"] == 640 // 64
    assert d["async"].get("max_staleness") == staleness
    assert d["async"].get("partial_rollout", False) is expect_partial
    assert d["actor_infer"]["device_mapping"] == [2, 3]


@pytest.mark.parametrize(
    "override, reason",
    [
        (f"{A}.actor.strategy=megatron", "Megatron"),
        (f"{A}.actor.megatron.tensor_model_parallel_size=2", "Megatron"),
        (f"{A}.rollout.name=sglang", "SGLang"),
        (f"{A}.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True", "vision-language"),
        (f"{A}.rollout.engine_kwargs.trtllm.batch_wait_timeout_iters=2", "TensorRT-LLM"),
        (f"{A}.model.exclude_modules=[lm_head]", "LoRA"),
        (f"{A}.actor.freeze_vision_tower=True", "vision-language"),
        ("reward_model.strategy=megatron", "Megatron"),
        ("algorithm.adv_estimator=tir_optimal_token_baseline", "not implemented"),
        (f"{A}.actor.policy_loss.loss_mode=bypass_mode", "not implemented"),
        ("trainer.logger=['console','mlflow']", "mlflow"),
        ("data.truncation=sideways", "error, left, right or middle"),
        ("async_training.staleness_threshold=0.5", "asynchronous recipes"),
        ("train_batch_size=0", "not a verl key"),
        (f"+{A}.rollout.segment.enable=True", "segmented rollout"),
    ],
)
def test_refused_by_name_with_the_reason(override, reason):
    key = override.lstrip("+").split("=")[0]
    assert reason in _refused(override)[key]


def test_knobs_with_no_effect_on_what_is_trained_get_a_row_saying_so():
    """Sequence parallelism, profilers, vLLM engine options: a row each, nothing refused."""
    t = _t(
        f"{A}.actor.ulysses_sequence_parallel_size=2",
        "global_profiler.tool=nsys",
        f"{A}.actor.profiler.enable=True",
        f"{A}.rollout.engine_kwargs.vllm.swap_space=4",
        "data.filter_overlong_prompts=True",
        "data.truncation=left",
    )
    assert t.refused == []
    notes = {row.sources[0]: row.note for row in t.rows if not row.target}
    assert "memory knob" in notes[f"{A}.actor.ulysses_sequence_parallel_size"]
    assert "profilers" in notes["global_profiler.tool"]
    assert "filter_overlong_prompts" in notes["data.truncation"]
    # without the filter, verl cuts a longer prompt to max_prompt_length as data.truncation says
    for how in ("left", "right", "middle"):
        assert _ok(f"data.truncation={how}")["prompt_truncation"] == how
    assert "prompt_truncation" not in _ok("data.truncation=error")  # dropped and counted here
    # dual-clip is verl's vanilla loss only
    d = _ok(f"{A}.actor.policy_loss.loss_mode=cispo", f"{A}.actor.clip_ratio_c=10")
    assert d["actor_train"]["pg_variant"] == "cispo" and "dual_clip_loss" not in d


def test_lora_of_the_actor_and_the_reference_as_its_base_model():
    """verl's lora_rank/lora_alpha/target_modules -> actor_train's LoRA keys; the KL's reference
    is the base model with the adapter disabled (no reference section, as verl's ref_in_actor)."""
    d = _ok(
        f"{A}.model.lora_rank=64",
        f"{A}.model.lora_alpha=32",
        f"{A}.model.target_modules=all-linear",
        f"{A}.actor.use_kl_loss=True",
    )
    args = d["actor_train"]["model_args"]
    assert (args["lora_rank"], args["lora_alpha"], args["lora_target"]) == (64, 32.0, "all-linear")
    assert "reference" not in d
    d = _ok(f"{A}.model.lora_adapter_path=/adapters/a", f"{A}.model.lora_rank=8")
    assert d["actor_train"]["model_args"]["adapter_name_or_path"] == "/adapters/a"
    assert "lora_rank" not in d["actor_train"]["model_args"]
    assert "lora_rank" not in _ok(f"{A}.model.lora_rank=0")["actor_train"]["model_args"]


def test_every_verl_key_is_translated_or_refused_by_a_rule():
    """verl's own key set (its ppo_trainer.yaml composed, and what its asynchronous recipes' files
    add): every key has a rule, and verl's defaults of the keys read here are verl's."""
    keys = {
        **KEYS["ppo_trainer"],
        **KEYS["one_step_off_ppo_trainer"],
        **KEYS["fully_async_ppo_trainer"],
    }
    assert len(keys) > 550
    assert [k for k in keys if rule_for(k) is None] == []
    required = {
        "data.train_files",
        "data.val_files",
        f"{A}.model.path",
        f"{A}.rollout.name",
        "critic.model.path",
        "trainer.default_local_dir",
        "critic.ppo_mini_batch_size",
        "critic.enable",
        "reward_manager.name",
        "critic.ppo_micro_batch_size_per_gpu",
    }
    recipe_only = {k for k in VERL_DEFAULTS if k.startswith(("rollout.", "async_training."))}
    ppo = KEYS["ppo_trainer"]
    differ = {
        k: (v, ppo[k])
        for k, v in VERL_DEFAULTS.items()
        if k in ppo and k not in required | recipe_only and ppo[k] != v
    }
    assert differ == {}
    assert set(VERL_DEFAULTS) - set(keys) <= recipe_only | {"ray_kwargs.ray_init.num_cpus"} | {
        k for k in VERL_DEFAULTS if "filter_groups" in k or "lr_decay_style" in k
    }


@pytest.mark.parametrize(
    "entry, extra",
    [
        ("verl.trainer.main_ppo", ()),
        (ONE_STEP_OFF, ("one_step_off_ppo_trainer",)),
        (FULLY_ASYNC, ("fully_async_ppo_trainer",)),
    ],
)
def test_verl_defaults_given_key_by_key_translate_without_refusal(entry, extra):
    """All of verl's keys at their defaults (plus what verl requires) translate: each default
    is accepted, and every key gets a row of the table."""
    given = dict(KEYS["ppo_trainer"])
    for name in extra:
        given.update(KEYS[name])
    overrides = [
        *_overrides(given),
        f"{A}.rollout.name=vllm",
        f"{A}.actor.ppo_micro_batch_size_per_gpu=4",
        "critic.ppo_micro_batch_size_per_gpu=4",
        "data.train_files=/x.parquet",
    ]
    t = translate(overrides, entry=entry, count_rows=lambda _p: 2048)
    assert t.refused == []
    rowed = {k for row in t.rows for k in row.sources}
    assert set(t.given) <= rowed


def test_verl_config_file_with_defaults_list(tmp_path):
    """--verl-config: the file's own keys over verl's (its defaults list names verl's config)."""
    (tmp_path / "mine.yaml").write_text(
        "hydra:\n  searchpath: [file://verl/trainer/config]\ndefaults:\n  - ppo_trainer\n"
        "  - _self_\ndata:\n  train_batch_size: 16\n  train_files: /data/train.parquet\n"
        "  val_files: /data/test.parquet\n"
        "actor_rollout_ref:\n  rollout:\n    n: 4\n"
    )
    t = translate(BASE[2:], config_file=tmp_path / "mine.yaml", count_rows=lambda _p: 64)
    assert t.refused == [] and (
        t.data["rollout_batch_size"],
        t.data["num_return_sequences_in_group"],
    ) == (16, 4)
    bad = translate(BASE, config_name="ppo_megatron_trainer").refused
    assert "Megatron" in bad[0].message and bad[0].path == "--config-name"


def test_convert_from_verl_writes_a_config_that_checks(tmp_path, capsys):
    out = tmp_path / "out.yaml"
    code = cli_main(
        [
            "convert",
            "--from",
            "verl",
            "-o",
            str(out),
            *BASE,
            "data.train_batch_size=8",
            f"{A}.actor.ppo_mini_batch_size=4",
            "trainer.device=cpu",
        ]
    )
    assert code == 0, capsys.readouterr().err
    text = out.read_text()
    assert "rollout_batch_size: 8  # verl: data.train_batch_size" in text
    assert "# no effect here" not in text or "verl" in text
    cfg, _ = load_app_config(out, [], section=None)
    assert (
        cfg.rollout_batch_size == 8
        and cfg.actor_train.training_args.gradient_accumulation_steps == 1
    )
    assert cli_main(["check", "-q", str(out)]) == 0
    # a refused key: exit 1, nothing written
    bad = tmp_path / "bad.yaml"
    assert (
        cli_main(
            ["convert", "--from", "verl", "-o", str(bad), *BASE, f"{A}.actor.strategy=megatron"]
        )
        == 1
    )
    assert not bad.exists() and "Megatron" in capsys.readouterr().err


def test_app_arguments_of_a_verl_command(tmp_path):
    """`--verl [-m MODULE]`, `--verl-config FILE`, and verl's `--config-path/--config-name`."""
    from rl_config.cli_args import parse_app_args

    args = parse_app_args(["--verl", "-m", ONE_STEP_OFF, "data.train_batch_size=8", "--dry-run"])
    assert args.verl is not None and args.verl.entry == ONE_STEP_OFF
    assert args.overrides == ["data.train_batch_size=8"] and "dry_run" in args.flags
    assert parse_app_args(["--verl"], verl_entry=FULLY_ASYNC).verl.entry == FULLY_ASYNC
    (tmp_path / "mine.yaml").write_text("data:\n  train_batch_size: 8\n")
    args = parse_app_args(["--verl", "--config-path", str(tmp_path), "--config-name", "mine"])
    assert args.verl.config_file == tmp_path / "mine.yaml"
    args = parse_app_args(["--verl-config", str(tmp_path / "mine.yaml")])
    assert args.verl.config_file == tmp_path / "mine.yaml" and args.config is None
    with pytest.raises(ConfigError, match="only with --verl"):
        parse_app_args(["-m", ONE_STEP_OFF])


def test_gpg_loss_and_hybrid_sharding_translate():
    """loss_mode=gpg is the plain policy gradient (``reinforce`` here, no dual-clip rows);
    fsdp_size below the role's ranks (verl's hybrid sharding) trains the same update: a row
    saying FSDP2 shards over all ranks, nothing refused."""
    d = _ok(f"{A}.actor.policy_loss.loss_mode=gpg", "algorithm.adv_estimator=gpg")
    assert d["actor_train"]["pg_variant"] == "reinforce" and d["adv_estimator"] == "gpg"
    assert "dual_clip_loss" not in d
    t = _t("trainer.n_gpus_per_node=4", f"{A}.actor.fsdp_config.fsdp_size=2")
    assert t.refused == []
    notes = {row.sources[0]: row.note for row in t.rows if not row.target}
    assert "all 4 ranks" in notes[f"{A}.actor.fsdp_config.fsdp_size"]


def test_reward_model_enable_is_one_reward_model_domain_on_the_trainers_devices():
    """verl returns the reward model's scores instead of the reward function's: one rewards
    domain (every row is its) scored by the reward model, on the trainer's devices (verl's
    global pool), micro_batch_size_per_gpu responses per forward; the reward function has no
    effect then. Without enable its keys change nothing; what cannot be honoured is refused."""
    rm = ["reward_model.enable=True", "reward_model.model.path=/models/rm"]
    d = _ok(*rm, "reward_model.micro_batch_size_per_gpu=4", "trainer.n_gpus_per_node=2",
            "reward_model.model.input_tokenizer=/models/policy", "reward_model.use_dynamic_bsz=True",
            "reward_model.use_reward_loop=False", "custom_reward_function.path=/r.py")  # fmt: skip
    assert d["rewards"] == {"reward_model": {
        "reward_fn": "reward_model", "model_args": {"model_name_or_path": "/models/rm", "dtype": "bf16"},
        "device_mapping": d["actor_train"]["device_mapping"], "infer_batch_size": 4}}  # fmt: skip
    assert "custom_reward_function" not in d
    assert (
        _ok(*rm, "trainer.device=cpu")["rewards"]["reward_model"]["model_args"]["dtype"] == "fp32"
    )
    off = _t("reward_model.model.path=/models/rm", "reward_model.micro_batch_size_per_gpu=4")
    assert off.refused == [] and "rewards" not in off.data
    assert (
        "read only with reward_model.enable"
        in {r.sources[0]: r.note for r in off.rows}["reward_model.model.path"]
    )
    assert "required" in _refused("reward_model.enable=True")["reward_model.model.path"]
    refused = _refused(*rm, "reward_model.enable_resource_pool=True", "reward_model.max_length=512")
    assert "shares the trainer's devices" in refused["reward_model.enable_resource_pool"]
    assert "not truncated" in refused["reward_model.max_length"]


def test_reward_loop_serving_a_reward_model_is_its_score_a_custom_function_is_refused():
    """verl's reward loop (reward_model.use_reward_loop, its default) serves the reward model with
    reward_model.rollout.name and reads its one-label score: the same reward_model domain.
    With a custom_reward_function the loop hands the served model to that function (a
    generative reward model): refused by name. The legacy worker returns the model's scores."""
    rm = ["reward_model.enable=True", "reward_model.model.path=/models/rm"]
    d = _ok(
        *rm, "reward_model.rollout.name=vllm", "reward_model.rollout.tensor_model_parallel_size=2"
    )
    assert d["rewards"]["reward_model"]["reward_fn"] == "reward_model"
    custom = ["custom_reward_function.path=/r.py", "reward_model.rollout.name=vllm"]
    assert "generative reward model" in _refused(*rm, *custom)["custom_reward_function.path"]
    legacy = _ok(*rm, "reward_model.use_reward_loop=False", "custom_reward_function.path=/r.py")
    assert "custom_reward_function" not in legacy
    assert _ok("reward_model.rollout.name=vllm").get("rewards") is None  # enable=False


def test_remote_code_sandbox_is_the_local_sandbox_marked_as_a_substitution():
    """verl's default scorer sends the code rows (codecontests, apps, codeforces, taco) to the
    sandbox at sandbox_fusion.url: here a code_sandbox domain for those data sources (10 s per
    test, verl's default), verl_default for the rest, every row of the table saying so; prime
    (parallel scoring) is the reward router's workers. A memory limit other than the local
    sandbox's is refused; verl uses the sandbox only with its default scorer."""
    fusion = ["reward_model.sandbox_fusion.url=https://sandbox.example/run_code",
              "reward_model.sandbox_fusion.max_concurrent=128", "reward_model.reward_manager=prime"]  # fmt: skip
    t = _t(*fusion)
    assert t.refused == []
    assert t.data["rewards"] == {
        "verl_default": {"reward_fn": "verl_default"},
        "code_sandbox": {"reward_fn": "code_sandbox", "timeout_s": 10.0,
                         "tag_included": ["codecontests", "apps", "codeforces", "taco"]},
    }  # fmt: skip
    notes = [r.note for r in t.rows if r.sources == ("reward_model.sandbox_fusion.url",)]
    assert any("SUBSTITUTED" in n and "sandbox.example" in n for n in notes)
    by_key = {r.sources[0]: r.note for r in t.rows if not r.target}
    assert "concurrent" in by_key["reward_model.sandbox_fusion.max_concurrent"]
    assert "in parallel" in by_key["reward_model.reward_manager"]
    memory = "reward_model.sandbox_fusion.memory_limit_mb"
    assert "1024 MB" in _refused(*fusion, f"{memory}=2048")[memory]
    assert _ok(*fusion, f"{memory}=1024")["rewards"]["code_sandbox"]["timeout_s"] == 10.0
    custom = _t(*fusion, "custom_reward_function.path=/r.py")
    assert custom.refused == [] and "rewards" not in custom.data
    assert "default scorer" in {r.sources[0]: r.note for r in custom.rows}[fusion[0].split("=")[0]]
    assert (
        "naive, dapo or prime"
        in _refused("reward_model.reward_manager=batch")["reward_model.reward_manager"]
    )


def test_model_config_override_goes_to_every_role_that_builds_the_model():
    """verl's override_config (attributes as keys, or a mapping): set on the actor's model in
    the trainer, the rollout engine and the reference (when there is one); the critic's on the
    critic; an empty one changes nothing; a value that is not a mapping is refused."""
    key = f"{A}.model.override_config"
    d = _ok(f"+{key}.max_position_embeddings=32768", f"+{key}.rope_scaling.factor=2.0")
    want = {"max_position_embeddings": 32768, "rope_scaling": {"factor": 2.0}}
    for role in ("actor_train", "actor_infer"):
        assert d[role]["model_args"]["model_config_kwargs"] == want
    assert "reference" not in d  # no KL: verl builds no reference, neither does this
    kl = _ok(f"{key}={{max_position_embeddings: 64}}", f"{A}.actor.use_kl_loss=True")
    assert kl["reference"]["model_args"]["model_config_kwargs"] == {"max_position_embeddings": 64}
    gae = _ok("algorithm.adv_estimator=gae", "critic.model.path=/models/critic", "critic.ppo_micro_batch_size_per_gpu=4",
              f"{key}.max_position_embeddings=64", "critic.model.override_config.max_position_embeddings=96")  # fmt: skip
    assert gae["critic"]["model_args"]["model_config_kwargs"] == {"max_position_embeddings": 96}
    assert gae["actor_train"]["model_args"]["model_config_kwargs"] == {
        "max_position_embeddings": 64
    }
    assert "model_config_kwargs" not in _ok(f"{key}={{}}")["actor_train"]["model_args"]
    assert "mapping" in _refused(f"{key}=7")[key]


def test_optimal_token_baseline_reads_the_actors_sum_pi_squared():
    """verl's OTB asserts actor.calculate_sum_pi_squared; here the actor's old-log-prob forward
    computes it for the estimator. Without the flag, or with IS-weighted baselines, refused."""
    otb = ["algorithm.adv_estimator=optimal_token_baseline"]
    t = _t(*otb, f"{A}.actor.calculate_sum_pi_squared=True")
    assert t.refused == []
    assert t.data["adv_estimator"] == "optimal_token_baseline"
    assert t.data["reward_normalization"]["method"] == "identity"
    notes = {r.sources[0]: r.note for r in t.rows if not r.target}
    assert "sum pi^2" in notes[f"{A}.actor.calculate_sum_pi_squared"]
    key = f"{A}.actor.calculate_sum_pi_squared"
    assert "verl asserts it too" in _refused(*otb)[key]
    is_key = "algorithm.rollout_correction.rollout_is"
    assert "IS-weighted" in _refused(*otb, f"{key}=True", f"{is_key}=token")[is_key]
    assert _t(f"{key}=True").refused == []  # grpo: verl only logs a metric from it
