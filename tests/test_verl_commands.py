"""verl users' commands run as they are written, after `uv run apps/rlvr --verl` (main_ppo) or
`uv run apps/async --verl -m MODULE` (the one-step-off and fully-async recipes): verl's GSM8K GRPO
quick start and the two asynchronous recipe scripts of an Ascend user, with local paths (a tiny
model built here, a GSM8K-format parquet written by tools/convert_math_data.py's converter) and
`trainer.device=cpu`. Each dry-runs; on a host without an NPU, `trainer.device=npu` stops before
anything starts, naming the device; the slow tests train two steps on the CPU (the scripts' own
`$@` overrides shrink the batches)."""

from __future__ import annotations

import json
import shlex

import pytest

from tests.app_loading import app_main

A = "actor_rollout_ref"

# python3 -m verl.trainer.main_ppo ... (verl's GSM8K GRPO quick start, as an Ascend user runs it)
MAIN_PPO = """algorithm.adv_estimator=grpo data.train_files={train} data.val_files={test}
data.train_batch_size=128 data.max_prompt_length=512 data.max_response_length=128
data.filter_overlong_prompts=True data.truncation='error' actor_rollout_ref.model.path={model}
actor_rollout_ref.actor.optim.lr=5e-7 actor_rollout_ref.model.use_remove_padding=False
actor_rollout_ref.actor.entropy_coeff=0.001 actor_rollout_ref.actor.ppo_mini_batch_size=64
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=20 actor_rollout_ref.actor.use_kl_loss=True
actor_rollout_ref.actor.kl_loss_coef=0.001 actor_rollout_ref.actor.kl_loss_type=low_var_kl
actor_rollout_ref.model.enable_gradient_checkpointing=True
actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40
actor_rollout_ref.rollout.enable_chunked_prefill=False
actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40
actor_rollout_ref.ref.fsdp_config.param_offload=True algorithm.kl_ctrl.kl_coef=0.001
trainer.critic_warmup=0 trainer.logger=console trainer.project_name='verl_grpo_example_gsm8k'
trainer.experiment_name='qwen2_7b_function_rm' trainer.n_gpus_per_node=2 trainer.nnodes=1
trainer.save_freq=-1 trainer.test_freq=5 trainer.total_epochs=1 trainer.device={device}"""

# python3 -m recipe.one_step_off_policy.main_ppo ... (NGPUS_PER_NODE=2: 1 trainer + 1 rollout)
ONE_STEP_OFF = """algorithm.adv_estimator=grpo data.train_files={train} data.val_files={test}
data.train_batch_size=32 data.max_prompt_length=2048 data.max_response_length=16384
data.filter_overlong_prompts=True data.filter_overlong_prompts_workers=64 data.truncation='error'
actor_rollout_ref.actor.strategy=fsdp2 critic.strategy=fsdp2 actor_rollout_ref.model.path={model}
actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.hybrid_engine=False
actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.ppo_mini_batch_size=32
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 actor_rollout_ref.actor.use_kl_loss=False
actor_rollout_ref.actor.kl_loss_coef=0.001 actor_rollout_ref.actor.kl_loss_type=low_var_kl
actor_rollout_ref.actor.entropy_coeff=0 actor_rollout_ref.actor.use_torch_compile=False
actor_rollout_ref.ref.use_torch_compile=False actor_rollout_ref.model.enable_gradient_checkpointing=True
actor_rollout_ref.actor.fsdp_config.param_offload=True
actor_rollout_ref.actor.fsdp_config.optimizer_offload=True
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1
actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.mode=async actor_rollout_ref.rollout.gpu_memory_utilization=0.8
actor_rollout_ref.rollout.max_num_batched_tokens=18432 actor_rollout_ref.rollout.n=8
actor_rollout_ref.rollout.enforce_eager=True actor_rollout_ref.rollout.load_format=safetensors
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1
actor_rollout_ref.ref.fsdp_config.param_offload=True actor_rollout_ref.actor.fsdp_config.fsdp_size=1
actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=18432
actor_rollout_ref.actor.ulysses_sequence_parallel_size=1
actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True
actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=18432
actor_rollout_ref.ref.ulysses_sequence_parallel_size=1
actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True algorithm.use_kl_in_reward=False
actor_rollout_ref.nccl_timeout=14400 trainer.critic_warmup=0 trainer.val_before_train=False
trainer.logger=['console','tensorboard'] trainer.project_name='GRPO'
trainer.experiment_name='GRPO-Qwen2.5-0.5b-gsm8k-2cards' trainer.default_local_dir={ckpt}
trainer.save_freq=10 trainer.test_freq=-1 trainer.total_epochs=15 trainer.resume_mode=auto
trainer.nnodes=1 trainer.device={device} trainer.n_gpus_per_node=1 rollout.nnodes=1
rollout.n_gpus_per_node=1"""

# python -m recipe.fully_async_policy.fully_async_main ... (the FSDP script's keys, with the data,
# model and algorithm keys its Megatron twin passes and it leaves to variables)
FULLY_ASYNC = """data.train_files={train} data.val_files={test} data.prompt_key=prompt
data.truncation='error' data.max_prompt_length=512 data.max_response_length=128
data.train_batch_size=0 data.gen_batch_size=1 data.return_raw_chat=True
actor_rollout_ref.rollout.n=16 algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=False
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.strategy=fsdp2 critic.strategy=fsdp2
actor_rollout_ref.hybrid_engine=False actor_rollout_ref.actor.use_dynamic_bsz=True
actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.actor.ppo_max_token_len_per_gpu=640
actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True
actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.mode=async actor_rollout_ref.rollout.calculate_log_probs=True
actor_rollout_ref.rollout.tensor_model_parallel_size=1 trainer.logger=['console','tensorboard']
trainer.val_before_train=True trainer.nnodes=1 trainer.n_gpus_per_node=1 trainer.device={device}
rollout.nnodes=1 rollout.n_gpus_per_node=1 rollout.total_rollout_steps=204800 rollout.test_freq=10
async_training.staleness_threshold=0.5 async_training.trigger_parameter_sync_step=16
async_training.require_batches=1 async_training.partial_rollout=True
async_training.use_rollout_log_probs=True"""

# python3 -m verl.trainer.main_ppo ... (verl's examples/ppo_trainer/run_gemma.sh: PPO, GAE, a critic;
# its batches halved twice for the 256-row file here)
PPO_GAE = """algorithm.adv_estimator=gae data.train_files={train} data.val_files={test}
data.train_batch_size=128 data.max_prompt_length=1024 data.max_response_length=512
data.filter_overlong_prompts=True data.truncation='error' actor_rollout_ref.model.path={model}
actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.model.use_remove_padding=False
actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.actor.use_kl_loss=False
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.gpu_memory_utilization=0.4 critic.optim.lr=1e-5
critic.model.use_remove_padding=False critic.model.path={model}
critic.model.enable_gradient_checkpointing=False critic.ppo_micro_batch_size_per_gpu=4
critic.model.fsdp_config.param_offload=False critic.model.fsdp_config.optimizer_offload=False
algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.logger='["console","wandb"]'
trainer.project_name='verl_example' trainer.experiment_name='gemma2b_function_rm'
trainer.n_gpus_per_node=2 trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=10
trainer.total_epochs=15 trainer.device={device}"""

SMALL = {  # the scripts' `$@`: batches and lengths a 2-core CPU trains in seconds
    "main_ppo": f"data.train_batch_size=8 {A}.actor.ppo_mini_batch_size=4 {A}.rollout.n=2 "
    f"{A}.actor.ppo_micro_batch_size_per_gpu=2 data.max_response_length=16 "
    "trainer.total_training_steps=2",
    "one_step_off": f"data.train_batch_size=8 {A}.actor.ppo_mini_batch_size=4 {A}.rollout.n=2 "
    "data.max_response_length=16 trainer.total_training_steps=2",
    "fully_async": f"{A}.actor.ppo_mini_batch_size=4 async_training.trigger_parameter_sync_step=2 "
    f"{A}.rollout.n=2 data.max_response_length=16 rollout.total_rollout_steps=16",
    "ppo_gae": f"data.train_batch_size=8 {A}.actor.ppo_mini_batch_size=4 "
    f"{A}.actor.ppo_micro_batch_size_per_gpu=2 critic.ppo_micro_batch_size_per_gpu=2 "
    "data.max_response_length=16 trainer.total_training_steps=2 "
    "trainer.logger=console trainer.test_freq=-1 trainer.val_before_train=False",
}
COMMANDS = {
    "main_ppo": ("rlvr", None, MAIN_PPO),
    "one_step_off": ("async", "recipe.one_step_off_policy.main_ppo", ONE_STEP_OFF),
    "fully_async": ("async", "recipe.fully_async_policy.fully_async_main", FULLY_ASYNC),
    "ppo_gae": ("rlvr", None, PPO_GAE),
}


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    """A tiny model and GSM8K-format parquet files (256 training, 8 held-out problems)."""
    from rl_envs.tasks.convert import convert_file
    from rl_rollout.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("verl_gsm8k")
    model = build_tiny_model(root / "model")
    for split, n in (("train", 256), ("test", 8)):
        rows = [
            {
                "question": f"What is {i} plus {i + 1}?",
                "answer": f"{i} + {i + 1} = {2 * i + 1}\n#### {2 * i + 1}",
            }
            for i in range(n)
        ]
        (root / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
        convert_file(str(root / f"{split}.jsonl"), str(root / f"{split}.parquet"), "gsm8k", split)
    return {
        "model": model,
        "train": root / "train.parquet",
        "test": root / "test.parquet",
        "ckpt": root / "ckpt",
        "root": root,
    }


def _argv(name: str, paths: dict, device: str, *extra: str) -> tuple[str, list[str]]:
    app, entry, text = COMMANDS[name]
    keys = {k: paths[k] for k in ("model", "train", "test", "ckpt")}
    command = shlex.split(text.format(device=device, **keys))
    head = ["--verl"] + (["-m", entry] if entry else [])
    return app, [*head, *command, *extra]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_verl_command_dry_runs_with_the_translation_table(name, gsm8k, monkeypatch, capsys):
    monkeypatch.chdir(gsm8k["root"])
    monkeypatch.setenv("RL_DEVICE", "cpu")  # the app exports trainer.device: restored after
    app, argv = _argv(name, gsm8k, "cpu", "--dry-run")
    assert app_main(app)(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.startswith("verl translation") and "data.train_files=" in out
    assert "system_envs.RL_DEVICE = cpu" in out
    if name == "main_ppo":  # 128 prompts x 5; 64 x 5 / 2 ranks = 160 a rank: micro 20 x 8
        assert "rollout_batch_size = 128" in out and "gradient_accumulation_steps = 8" in out
        assert "kl_loss_type = k3" in out and "asynchronous: None" in out
    elif name == "one_step_off":
        assert "max_staleness=1," in out and "partial_rollout=False" in out
    elif name == "fully_async":  # 16 syncs x 1 x 32 prompts a version; ceil(.5) = 1 ahead
        assert "rollout_batch_size = 512" in out
        assert "max_staleness=1," in out and "partial_rollout=True" in out
    else:  # a critic beside the actor: 32 prompts x 1 sample / 2 ranks, micro 4 -> 4
        assert "adv_estimator = gae" in out and "critic.model_args.model_name_or_path" in out
        assert "critic.training_args.gradient_accumulation_steps = 4" in out


def test_verl_reward_model_command_dry_runs_with_a_reward_model_role(
    gsm8k, monkeypatch, capsys, tmp_path
):
    """`reward_model.enable=True` with a local reward model: one rewards domain scored by it,
    its role on the trainer's two devices."""
    from rl_rollout.tiny_reward_models import build_tiny_reward_model

    monkeypatch.chdir(gsm8k["root"])
    monkeypatch.setenv("RL_DEVICE", "cpu")
    rm = build_tiny_reward_model(tmp_path / "rm")
    app, argv = _argv("main_ppo", gsm8k, "cpu", "--dry-run", "reward_model.enable=True",
                      f"reward_model.model.path={rm}", "reward_model.micro_batch_size_per_gpu=8")  # fmt: skip
    assert app_main(app)(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "rewards.reward_model.reward_fn = reward_model" in out
    assert "reward_reward_model workers=2 devices=[0, 1]" in out
    flat = " ".join(out.split())
    assert "domain='reward_model', kind='reward_model'" in flat and "batch_size=8" in flat


@pytest.mark.parametrize("name", list(COMMANDS))
def test_an_npu_command_on_a_host_without_one_stops_naming_the_device(name, gsm8k, capsys):
    from rl_sync.device import is_available

    if is_available("npu"):
        pytest.skip("this host has an NPU")
    app, argv = _argv(name, gsm8k, "npu", "--dry-run")
    assert app_main(app)(argv) == 1
    err = capsys.readouterr().err
    assert "system_envs.RL_DEVICE" in err and "trainer.device=npu" in err and "no npu device" in err


@pytest.mark.slow
@pytest.mark.usefixtures("shared_ray")
@pytest.mark.parametrize("name", list(COMMANDS))
def test_verl_command_trains_two_steps_on_the_cpu(name, gsm8k, monkeypatch, capsys, tmp_path):
    """vLLM is not installed here: the scripts' `$@` also picks verl's HF rollout. The run
    joins the module's Ray cluster, started before the test moved into `tmp_path`, as a
    command joins a running cluster (RAY_ADDRESS): its relative checkpoint and output paths
    name the same directories in the workers as in the driver."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RL_DEVICE", "cpu")  # the app exports trainer.device: restored after
    app, argv = _argv(name, gsm8k, "cpu", *SMALL[name].split(), f"{A}.rollout.name=hf")
    assert app_main(app)(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "step 2/2" in out
    summary = json.loads(next(tmp_path.glob("output/*/*/summary.json")).read_text())
    assert summary["step"] == 2 and summary["weight_version"] == 2, summary
    if name == "ppo_gae":  # the critic trained beside the actor, every step
        rows = [json.loads(line) for line in next(tmp_path.glob("output/*/*/logs/*.jsonl")).open()]
        steps = [r for r in rows if "critic/loss" in r]
        assert [r["step"] for r in steps] == [1, 2], rows


@pytest.mark.slow
@pytest.mark.usefixtures("shared_ray")
def test_verl_reward_model_command_trains_two_steps_scored_by_the_reward_model(
    gsm8k, monkeypatch, capsys, tmp_path
):
    """verl's quick start with `reward_model.enable=True` and a local reward model, on one
    device: every response is scored by the reward model (its domain's rewards in each step's
    metrics, none failed), two steps train."""
    from rl_rollout.tiny_reward_models import build_tiny_reward_model

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RL_DEVICE", "cpu")
    rm = build_tiny_reward_model(tmp_path / "rm")
    app, argv = _argv("main_ppo", gsm8k, "cpu", *SMALL["main_ppo"].split(), f"{A}.rollout.name=hf",
                      "trainer.n_gpus_per_node=1", "reward_model.enable=True",
                      f"reward_model.model.path={rm}")  # fmt: skip
    assert app_main(app)(argv) == 0, capsys.readouterr().err
    logs = next(tmp_path.glob("output/*/*/logs/metrics.jsonl"))
    steps = [r for r in map(json.loads, logs.read_text().splitlines()) if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert "reward/domain/reward_model/mean" in r
        assert r["reward/domain/reward_model/failed"] == 0 and r["reward/failed"] == 0


def test_a_model_config_override_dry_runs_and_a_misspelt_one_stops_naming_it(
    gsm8k, monkeypatch, capsys
):
    """`+actor_rollout_ref.model.override_config.<attribute>`: the trainer's, the engine's and
    the reference's model_config_kwargs; an attribute the model's config lacks stops the dry run
    at preflight, naming the key."""
    monkeypatch.chdir(gsm8k["root"])
    monkeypatch.setenv("RL_DEVICE", "cpu")
    key = f"{A}.model.override_config"
    app, argv = _argv("main_ppo", gsm8k, "cpu", "--dry-run", f"+{key}.max_position_embeddings=4096")
    assert app_main(app)(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    for role in ("actor_train", "actor_infer", "reference"):
        assert f'{role}.model_args.model_config_kwargs = {{"max_position_embeddings": 4096}}' in out
    assert out.count("config_overrides={'max_position_embeddings': 4096}") >= 3  # the plans
    app, argv = _argv("main_ppo", gsm8k, "cpu", "--dry-run", f"+{key}.max_postion_embeddings=64")
    assert app_main(app)(argv) == 1
    err = capsys.readouterr().err
    assert "actor_train.model_args.model_config_kwargs.max_postion_embeddings: not an" in err
