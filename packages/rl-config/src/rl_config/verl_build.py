"""The part of the verl translation that reads several verl keys at once: batches, devices,
steps, roles, the loss and the asynchronous recipes (see :mod:`rl_config.verl_translate`)."""

from __future__ import annotations

import math
from typing import Any

A = "actor_rollout_ref"
ACTOR = f"{A}.actor"
ROLLOUT = f"{A}.rollout"
DEVICE_KINDS = ("cpu", "cuda", "npu")


def build(out: Any, mode: str, count_rows: Any) -> None:
    """Write the derived keys of ``out`` (verl_translate._Out) for ``mode``."""
    from rl_config import verl_translate as vt

    g = out.get
    device = str(g("trainer.device") or "cuda").lower()
    if device not in DEVICE_KINDS:
        out.refuse("trainer.device", f"one of {', '.join(DEVICE_KINDS)}")
        device = "cpu"
    out.set(
        ["trainer.device"],
        "system_envs.RL_DEVICE",
        device,
        "the device every worker uses; a device the host lacks is refused up front",
    )
    dtype = "fp32" if device == "cpu" else "bf16"

    # names and outputs
    project, exp = str(g("trainer.project_name")), str(g("trainer.experiment_name"))
    out.set(["trainer.experiment_name"], "exp_name", exp)
    out.set(
        ["trainer.project_name", "trainer.experiment_name"],
        "output_dir",
        f"./output/{project}/{exp}",
        "run outputs",
    )
    out.set(
        ["trainer.project_name", "trainer.experiment_name"],
        "logging_dir",
        f"./output/{project}/{exp}/logs",
    )
    ckpt = g("trainer.default_local_dir") or f"checkpoints/{project}/{exp}"
    out.set(["trainer.default_local_dir"], "checkpoint_config.output_dir", ckpt)
    logger = g("trainer.logger")
    loggers = [logger] if isinstance(logger, str) else list(logger or [])
    tracker = next((t for t in vt.TRACKERS if t in loggers), "stdout")
    unknown = [x for x in loggers if x not in ("console", *vt.TRACKERS)]
    if unknown:
        out.refuse("trainer.logger", f"{unknown}: trackers here are console, tensorboard, wandb")
    out.set(
        ["trainer.logger"],
        "track_with",
        tracker,
        "console progress is always printed; one tracker besides it",
    )
    if tracker == "wandb":
        out.set(["trainer.project_name"], "tracker_kwargs.project", project)
    seed = g("data.seed")
    out.set(["data.seed"], "seed", 42 if seed is None else int(seed), "verl's data seed 42")
    num_cpus = g("ray_kwargs.ray_init.num_cpus") or g("ray_init.num_cpus")
    if num_cpus is not None:
        out.set(["ray_kwargs.ray_init.num_cpus"], "rlvr_app.num_cpus", num_cpus)

    # model
    path = g(f"{A}.model.path")
    if path is None:
        out.refuse(f"{A}.model.path", "required (the policy model)")
    else:
        out.set([f"{A}.model.path"], "pretrain", str(path))

    # data
    train = vt._files(g("data.train_files"))
    val = vt._files(g("data.val_files"))
    if not train:
        out.refuse("data.train_files", "required (verl's parquet files)")
    else:
        out.set(
            ["data.train_files"],
            "actor_train.data_args.file_name",
            train[0] if len(train) == 1 else train,
        )
    if val:
        out.set(
            ["data.val_files"],
            "actor_train.data_args.eval_file_name",
            val[0] if len(val) == 1 else val,
        )
    out.set(
        ["data.train_files"],
        "actor_train.data_args.template",
        "native",
        "the tokenizer's chat template, as verl applies it",
    )
    key = g("data.prompt_key")
    if key != "prompt":
        out.set(["data.prompt_key"], "actor_train.data_args.messages", key, "chat messages")
    truncation = str(g("data.truncation") or "error")
    if _bool(g("data.filter_overlong_prompts")):
        if "data.truncation" in out.given:
            out.noop("data.truncation", "filter_overlong_prompts drops longer prompts first")
    elif truncation == "error":
        if "data.truncation" in out.given:
            out.noop("data.truncation", "a longer prompt is dropped and counted (verl stops)")
    elif truncation in ("left", "right", "middle"):
        out.set(
            ["data.truncation", "data.filter_overlong_prompts"],
            "prompt_truncation",
            truncation,
            "a longer prompt is cut to max_prompt_length tokens (counted), as verl cuts it",
        )
    else:
        out.refuse("data.truncation", f"{truncation!r}: error, left, right or middle")
    prompt_len, response_len = (
        out.integer("data.max_prompt_length"),
        out.integer("data.max_response_length"),
    )
    out.set(
        ["data.max_prompt_length"],
        "prompt_length",
        prompt_len,
        "longer prompts are dropped and counted, unless data.truncation cuts them",
    )
    out.set(["data.max_response_length"], "response_length", response_len)

    n = out.integer(f"{ROLLOUT}.n")
    mini = out.integer(f"{ACTOR}.ppo_mini_batch_size")
    train_nodes, train_gpus = out.integer("trainer.nnodes"), out.integer("trainer.n_gpus_per_node")
    _devices(out, mode, train_nodes, train_gpus)
    train_world = train_nodes * train_gpus

    # prompts per step
    if mode == vt.FULLY_ASYNC:
        trigger = out.integer("async_training.trigger_parameter_sync_step")
        require = out.integer("async_training.require_batches")
        prompts = trigger * require * mini
        out.set(
            [
                "async_training.trigger_parameter_sync_step",
                "async_training.require_batches",
                f"{ACTOR}.ppo_mini_batch_size",
            ],
            "rollout_batch_size",
            prompts,
            f"one weight version: {trigger} x {require} x {mini} prompts "
            "(data.train_batch_size is not read by the fully-async recipe)",
        )
        if "data.train_batch_size" in out.given:
            out.noop("data.train_batch_size", "not read by the fully-async recipe")
    else:
        prompts = out.integer("data.train_batch_size")
        out.set(["data.train_batch_size"], "rollout_batch_size", prompts, "prompts per step")
    out.set(
        [f"{ROLLOUT}.n"],
        "num_return_sequences_in_group",
        n,
        f"samples per step = {prompts} x {n} = {prompts * n}",
    )
    _trained_role(out, "actor_train", ACTOR, prompts, n, mini, train_world, dtype)
    epochs = out.integer(f"{ACTOR}.ppo_epochs")
    out.set([f"{ACTOR}.ppo_epochs"], "ppo_epochs", epochs)

    # steps and cadence
    _steps(out, mode, prompts, count_rows)
    _cadence(out, mode, val, count_rows)

    # loss and advantages
    _loss(out)
    _roles(out, dtype, prompts, n, mini, train_world)
    _rollout(out, n, response_len, dtype)
    _async(out, mode)
    _reward(out)
    roles = ("actor_train", "actor_infer", "reference" if "reference" in out.data else "")
    _model_config(out, f"{A}.model.override_config", tuple(r for r in roles if r))
    _model_config(out, "critic.model.override_config", ("critic",) if "critic" in out.data else ())


def _sum_pi_squared(out: Any, estimator: str) -> None:
    """verl's optimal token baseline reads the actor's `sum_pi_squared` (it asserts
    `actor.calculate_sum_pi_squared=True`); here the actor's old-log-prob forward computes it
    whenever the estimator needs it. verl scales the baseline's weights by the rollout IS weights
    when `rollout_correction.rollout_is` is on: not implemented, refused by name."""
    key = f"{ACTOR}.calculate_sum_pi_squared"
    on = _bool(out.get(key))
    if estimator == "optimal_token_baseline":
        if not on:
            out.refuse(key, "optimal_token_baseline needs it (verl asserts it too)")
        else:
            out.noop(key, "the actor's old-log-prob forward computes sum pi^2 for the estimator")
        is_key = "algorithm.rollout_correction.rollout_is"
        if out.get(is_key) not in (None, False, "null", "None"):
            out.refuse(is_key, "optimal_token_baseline with IS-weighted baselines is not "
                       "implemented")  # fmt: skip
    elif on:
        out.noop(key, "with this estimator verl only logs a variance metric from it (not "
                 "computed here; the training is the same)")  # fmt: skip


def _model_config(out: Any, prefix: str, roles: tuple[str, ...]) -> None:
    """verl's `model.override_config` (a mapping, or its attributes as keys: `+...override_config.
    max_position_embeddings=32768`): HF config attributes verl sets on the model it builds ->
    `<role>.model_args.model_config_kwargs` of each role that builds that model (the actor's:
    trainer, rollout engine and reference), where they are checked against the model's config
    (an unknown attribute is an error naming it)."""
    given = [k for k in out.given if k == prefix or k.startswith(prefix + ".")]
    values: dict[str, Any] = {}
    for key in given:
        value = out.given[key]
        if key == prefix:
            if not isinstance(value, dict):
                out.refuse(key, "expected a mapping of model config attributes")
                continue
            values.update(value)
            continue
        *parents, last = key[len(prefix) + 1 :].split(".")
        node = values
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    if not values or not roles:
        why = "empty: no model config attribute is overridden" if not values else "no critic"
        for key in given:
            if key not in out.covered:
                out.noop(key, why)
        return
    for role in roles:
        out.set(given, f"{role}.model_args.model_config_kwargs", values,
                "set on the HF model config before the weights load")  # fmt: skip


def _devices(out: Any, mode: str, nodes: int, gpus: int) -> None:
    from rl_config import verl_translate as vt

    sources = ["trainer.nnodes", "trainer.n_gpus_per_node"]
    if mode == "sync":
        hybrid = out.get(f"{A}.hybrid_engine")
        if hybrid is False or str(hybrid).lower() == "false":
            out.refuse(
                f"{A}.hybrid_engine",
                "main_ppo needs the hybrid engine (verl asserts "
                "it); separate rollout devices: the one-step-off or fully-async recipe",
            )
        elif f"{A}.hybrid_engine" in out.given:
            out.noop(f"{A}.hybrid_engine", "every role shares the devices (colocated)")
        total = nodes * gpus
        out.rollout_devices = total
        out.set(sources, "num_nodes", nodes)
        out.set(sources, "num_gpus_per_node", gpus)
        mapping = f"list(range(0,{total}))"
        for role in ("actor_train", "actor_infer"):
            out.set(
                sources,
                f"{role}.device_mapping",
                mapping,
                "verl's hybrid engine: every role on all devices",
            )
        return
    if f"{A}.hybrid_engine" in out.given:
        out.noop(f"{A}.hybrid_engine", "the asynchronous recipes give rollout its own devices")
    r_nodes, r_gpus = out.integer("rollout.nnodes"), out.integer("rollout.n_gpus_per_node")
    if r_nodes != nodes:
        out.refuse(
            "rollout.nnodes",
            f"{r_nodes} rollout nodes beside {nodes} trainer nodes: "
            "both pools must span the same nodes here",
        )
    per_node = gpus + r_gpus
    out.rollout_devices = r_nodes * r_gpus
    trainer = [n * per_node + i for n in range(nodes) for i in range(gpus)]
    rollout = [n * per_node + gpus + i for n in range(nodes) for i in range(r_gpus)]
    both = [*sources, "rollout.nnodes", "rollout.n_gpus_per_node"]
    out.set(both, "num_nodes", nodes)
    out.set(
        both, "num_gpus_per_node", per_node, f"{gpus} trainer + {r_gpus} rollout devices per node"
    )
    out.set(sources, "actor_train.device_mapping", trainer)
    out.set(
        ["rollout.nnodes", "rollout.n_gpus_per_node"],
        "actor_infer.device_mapping",
        rollout,
        "rollout's own devices",
    )
    del vt


def _trained_role(
    out: Any, role: str, prefix: str, prompts: int, n: int, mini: int, world: int, dtype: str
) -> None:
    """Batch arithmetic, optimizer, offload and checkpointing of a trained role."""
    from rl_config import verl_translate as vt

    g = out.get
    mini_key = f"{prefix}.ppo_mini_batch_size"
    if prompts % mini:
        out.refuse(mini_key, f"{mini} does not divide the {prompts} prompts of a step")
        return
    samples = mini * n
    if samples % world:
        out.refuse(
            mini_key,
            f"ppo_mini_batch_size x rollout.n = {samples} samples per optimizer "
            f"step do not split over {world} ranks",
        )
        return
    share = samples // world
    micro = g(f"{prefix}.ppo_micro_batch_size_per_gpu")
    micro_key = f"{prefix}.ppo_micro_batch_size_per_gpu"
    legacy = g(f"{prefix}.ppo_micro_batch_size")  # verl's global micro-batch (deprecated)
    if micro is None and legacy is not None:
        micro, micro_key = (
            max(1, out.integer(f"{prefix}.ppo_micro_batch_size") // world),
            f"{prefix}.ppo_micro_batch_size",
        )
    dynamic_value = g(f"{prefix}.use_dynamic_bsz")
    if dynamic_value is None and prefix != ACTOR:  # verl: the critic's follows the actor's
        dynamic_value = g(f"{ACTOR}.use_dynamic_bsz")
    dynamic = _bool(dynamic_value)
    if micro is None:
        if not dynamic:
            out.refuse(micro_key, "required unless use_dynamic_bsz (verl asserts it too)")
            return
        micro = share
    per_device = vt._largest_divisor(share, int(micro))
    args = f"{role}.training_args"
    note = f"{mini} prompts x {n} samples / {world} ranks = {share} per rank per optimizer step"
    sources = [mini_key, f"{ROLLOUT}.n", "trainer.n_gpus_per_node", "trainer.nnodes"]
    out.set(
        [micro_key],
        f"{args}.per_device_train_batch_size",
        per_device,
        "a memory knob: the largest divisor of a rank's share not above it"
        if per_device != int(micro)
        else "a memory knob",
    )
    out.set(
        sources,
        f"{args}.gradient_accumulation_steps",
        share // per_device,
        f"{note}; {prompts // mini} optimizer steps per step",
    )
    if dynamic:
        out.set(
            [f"{prefix}.use_dynamic_bsz"],
            f"{role}.use_dynamic_batching_in_train",
            True,
            "a memory knob: micro-batches by token budget",
        )
        tokens = g(f"{prefix}.ppo_max_token_len_per_gpu") or 16384
        out.set(
            [f"{prefix}.ppo_max_token_len_per_gpu"],
            f"{role}.max_tokens_per_microbatch_in_train",
            int(tokens),
        )
    elif f"{prefix}.ppo_max_token_len_per_gpu" in out.given:
        out.noop(f"{prefix}.ppo_max_token_len_per_gpu", "read only with use_dynamic_bsz")
    _optim(out, role, prefix)
    fsdp = f"{prefix}.fsdp_config" if role == "actor_train" else "critic.model.fsdp_config"
    size_key = f"{fsdp}.fsdp_size"
    size = g(size_key)
    if size is not None and int(size) not in (-1, world):
        out.noop(
            size_key,
            f"{size}: FSDP2 shards over all {world} ranks here (verl's hybrid sharding, "
            f"replicas of {size}-rank shards, averages the same gradients: a memory and "
            "communication layout, the same update)",
        )
    elif size_key in out.given:
        out.noop(size_key, f"FSDP2 shards over all {world} ranks of the role")
    strategy = g(f"{prefix}.strategy") or "fsdp"
    offload = any(
        g(f"{fsdp}.{k}") in (True, "True", "true")
        for k in ("param_offload", "optimizer_offload", "offload_policy")
    )
    sc = f"{role}.strategy_args"
    out.set(
        [f"{prefix}.strategy"], f"{sc}.strategy_name", "fsdp2_train", f"verl {strategy}: FSDP2 here"
    )
    offload_keys = [f"{fsdp}.{k}" for k in ("param_offload", "optimizer_offload", "offload_policy")]
    options: dict[str, Any] = {"reduce_dtype": "fp32"}
    if dtype != "fp32":
        options["param_dtype"] = dtype
    if offload and dtype != "fp32":  # (fp32: trainer.device=cpu, the parameters are in host memory)
        options["cpu_offload"] = True
    for option, value in options.items():
        src = offload_keys if option == "cpu_offload" else ["trainer.device"]
        out.set(
            src,
            f"{sc}.strategy_config.{option}",
            value,
            "verl's mixed precision" if option != "cpu_offload" else "",
        )
    for k in offload_keys:
        if k in out.given and "cpu_offload" not in options:
            out.noop(
                k,
                "off, as verl's default"
                if not offload
                else "trainer.device=cpu: the parameters are in host memory already",
            )
    out.set(
        ["trainer.device"],
        f"{role}.model_args.dtype",
        dtype,
        "fp32 master weights; bf16 compute on accelerators",
    )
    model = f"{A}.model" if role == "actor_train" else "critic.model"
    ckpt = g(f"{model}.enable_gradient_checkpointing")
    out.set(
        [f"{model}.enable_gradient_checkpointing"],
        f"{role}.model_args.disable_gradient_checkpointing",
        ckpt not in (True, "True", "true"),
        "inverted",
    )
    if role == "actor_train":
        _lora(out)
        packed = g(f"{A}.model.use_remove_padding") in (True, "True", "true")
        if f"{A}.model.use_remove_padding" in out.given:
            out.set(
                [f"{A}.model.use_remove_padding"],
                f"{sc}.strategy_config.packed_forward",
                packed,
                "a speed knob (sequences packed without padding)",
            )
        lp = g(f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu")
        if lp is not None:
            out.set(
                [f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu"],
                "actor_train.infer_batch_size",
                int(lp),
                "a memory knob (old log-probs are computed by actor_train)",
            )


def _lora(out: Any) -> None:
    """verl's LoRA of the actor (lora_rank > 0, or an adapter to start from) -> model_args."""
    g = out.get
    m = f"{A}.model"
    rank = out.integer(f"{m}.lora_rank") if g(f"{m}.lora_rank") is not None else 0
    adapter = g(f"{m}.lora_adapter_path")
    keys = [f"{m}.lora_rank", f"{m}.lora_alpha", f"{m}.target_modules", f"{m}.lora_adapter_path"]
    if rank <= 0 and not adapter:
        for k in keys:
            if k in out.given:
                out.noop(k, "LoRA is off (lora_rank 0)")
        return
    args = "actor_train.model_args"
    if adapter:
        out.set(
            [f"{m}.lora_adapter_path"],
            f"{args}.adapter_name_or_path",
            str(adapter),
            "the adapter's own rank, alpha and targets apply",
        )
        for k in keys[:3]:
            if k in out.given:
                out.noop(k, "the adapter's own settings apply")
        return
    target = g(f"{m}.target_modules") or "all-linear"
    out.set([f"{m}.lora_rank"], f"{args}.lora_rank", rank)
    out.set(
        [f"{m}.lora_alpha"],
        f"{args}.lora_alpha",
        out.number(f"{m}.lora_alpha"),
        "verl's default 16",
    )
    out.set(
        [f"{m}.target_modules"],
        f"{args}.lora_target",
        list(target) if isinstance(target, (list, tuple)) else str(target),
        "only the adapters train; the reference is the base model (adapter disabled)",
    )


def _optim(out: Any, role: str, prefix: str) -> None:
    from rl_config import verl_translate as vt

    g = out.get
    args = f"{role}.training_args"
    o = f"{prefix}.optim"
    out.set([f"{o}.lr"], f"{args}.learning_rate", out.number(f"{o}.lr"))
    out.set([f"{o}.weight_decay"], f"{args}.weight_decay", out.number(f"{o}.weight_decay"))
    betas = g(f"{o}.betas") or [0.9, 0.999]
    out.set([f"{o}.betas"], f"{args}.adam_beta1", float(betas[0]))
    out.set([f"{o}.betas"], f"{args}.adam_beta2", float(betas[1]))
    steps = g(f"{o}.lr_warmup_steps")
    ratio = g(f"{o}.lr_warmup_steps_ratio") or 0.0
    if steps is not None and int(steps) > 0:
        out.set(
            [f"{o}.lr_warmup_steps"],
            f"{args}.warmup_steps",
            int(steps),
            "in optimizer steps, as verl counts them",
        )
    elif float(ratio) > 0:
        out.set([f"{o}.lr_warmup_steps_ratio"], f"{args}.warmup_ratio", float(ratio))
    else:
        out.set(
            [f"{o}.lr_warmup_steps", f"{o}.lr_warmup_steps_ratio"],
            f"{args}.warmup_steps",
            0,
            "verl's default: no warm-up",
        )
    style = g(f"{o}.lr_decay_style") or g(f"{o}.warmup_style") or g(f"{o}.lr_scheduler_type")
    style = str(style or "constant")
    name = vt.SCHEDULES.get(style)
    src = [
        k
        for k in (f"{o}.lr_scheduler_type", f"{o}.warmup_style", f"{o}.lr_decay_style")
        if k in out.given
    ] or [f"{o}.lr_scheduler_type"]
    if name is None:
        out.refuse(src[0], f"schedule {style!r}: constant, cosine or linear")
        return
    warm = (steps is not None and int(steps) > 0) or float(ratio) > 0
    if name == "constant" and warm:
        name = "constant_with_warmup"
    for key in src[1:]:
        out.noop(key, f"one schedule: {src[0]} decides")
    out.set(src[:1], f"{args}.lr_scheduler_type", name, "warm-up, then the schedule")
    clip = g(f"{o}.clip_grad") if f"{o}.clip_grad" in out.given else g(f"{prefix}.grad_clip")
    if role == "actor_train":
        out.set([f"{o}.clip_grad", f"{prefix}.grad_clip"], "max_grad_norm", float(clip or 1.0))
    else:
        for k in (f"{o}.clip_grad", f"{prefix}.grad_clip"):
            if k in out.given:
                out.noop(k, "one max_grad_norm for every trained role (the actor's)")


def _steps(out: Any, mode: str, prompts: int, count_rows: Any) -> None:
    from rl_config import verl_translate as vt

    g = out.get
    total = g("trainer.total_training_steps")
    if mode == vt.FULLY_ASYNC and g("rollout.total_rollout_steps") is not None:
        rollouts = out.integer("rollout.total_rollout_steps")
        steps = max(1, rollouts // prompts)
        out.set(
            ["rollout.total_rollout_steps"],
            "max_steps",
            steps,
            f"{rollouts} prompts / {prompts} per step",
        )
        for k in ("rollout.total_epochs", "trainer.total_epochs", "trainer.total_training_steps"):
            if k in out.given:
                out.noop(k, "the fully-async recipe counts rollout.total_rollout_steps")
        return
    if total is not None:
        out.set(["trainer.total_training_steps"], "max_steps", int(total))
        if "trainer.total_epochs" in out.given:
            out.noop("trainer.total_epochs", "trainer.total_training_steps decides")
        return
    epochs_key = "rollout.total_epochs" if mode == vt.FULLY_ASYNC else "trainer.total_epochs"
    epochs = int(g(epochs_key) or g("trainer.total_epochs"))
    train = vt._files(g("data.train_files"))
    counts = [count_rows(f) for f in train]
    if not train or any(c is None for c in counts):
        out.refuse(
            epochs_key,
            "steps per epoch need the training file's row count (a readable "
            "parquet file and pyarrow); give trainer.total_training_steps",
        )
        return
    rows = sum(counts)
    per_epoch = rows // prompts
    if per_epoch < 1:
        out.refuse("data.train_batch_size", f"{prompts} prompts per step but only {rows} rows")
        out.covered.add(epochs_key)
        return
    out.set(
        [epochs_key, "data.train_files", "data.train_batch_size"],
        "max_steps",
        epochs * per_epoch,
        f"{epochs} epochs x ({rows} rows // {prompts} prompts), "
        "counted before overlong prompts are dropped",
    )


def _cadence(out: Any, mode: str, val: list[str], count_rows: Any) -> None:
    from rl_config import verl_translate as vt

    g = out.get
    freq_key = "rollout.test_freq" if mode == vt.FULLY_ASYNC else "trainer.test_freq"
    freq = g(freq_key)
    if freq is None:
        freq_key, freq = "trainer.test_freq", g("trainer.test_freq")
    eval_steps = int(freq) if freq is not None and int(freq) > 0 else 0
    before = g("trainer.val_before_train") in (True, "True", "true")
    if not val:
        if eval_steps or before:
            out.refuse("data.val_files", "validation (test_freq, val_before_train) needs it")
        eval_steps, before = 0, False
    out.set([freq_key], "eval_steps", eval_steps, "-1: never")
    if (
        mode == vt.FULLY_ASYNC
        and "trainer.test_freq" in out.given
        and freq_key != "trainer.test_freq"
    ):
        out.noop("trainer.test_freq", "the fully-async recipe reads rollout.test_freq")
    if before:
        if "trainer.val_before_train" in out.given:
            out.noop("trainer.val_before_train", "apps/rlvr validates before training by default")
    else:
        out.set(
            ["trainer.val_before_train"],
            "rlvr_app.eval_before_training",
            False,
            "an option of apps/rlvr",
        )
    if val:
        counts = [count_rows(f) for f in val]
        if all(c is not None for c in counts):
            out.set(
                ["data.val_files"],
                "val_batch_size",
                sum(counts),
                "verl validates on the whole held-out file",
            )
    save = g("trainer.save_freq")
    save_steps = int(save) if save is not None and int(save) > 0 else None
    if save_steps is not None:
        out.set(["trainer.save_freq"], "save_steps", save_steps, "the last step saves too")
    else:
        steps = out.data.get("max_steps", 1)
        out.set(
            ["trainer.save_freq"],
            "save_steps",
            steps,
            "-1: only the last step saves here (verl saves none)",
        )
    mode_ = str(g("trainer.resume_mode") or "auto")
    path = g("trainer.resume_from_path")
    if mode_ == "resume_path" and path:
        out.set(
            ["trainer.resume_mode", "trainer.resume_from_path"], "resume_from_checkpoint", str(path)
        )
    elif mode_ in ("auto", "resume_path"):
        out.set(
            ["trainer.resume_mode"],
            "resume_from_checkpoint",
            True,
            "auto: the newest checkpoint of the checkpoint directory, if any",
        )
        if "trainer.resume_from_path" in out.given:
            out.noop("trainer.resume_from_path", "read only with resume_mode=resume_path")
    elif mode_ == "disable":
        out.set(["trainer.resume_mode"], "resume_from_checkpoint", False)
    else:
        out.refuse("trainer.resume_mode", "auto, disable or resume_path")
    keep = g("trainer.max_actor_ckpt_to_keep")
    if keep is not None:
        out.set(["trainer.max_actor_ckpt_to_keep"], "max_ckpt_to_keep", int(keep))


def _loss(out: Any) -> None:
    from rl_config import verl_translate as vt

    g = out.get
    est_key = "algorithm.adv_estimator"
    est = str(g(est_key))
    ours = vt.ESTIMATORS.get(est)
    if ours is None:
        out.refuse(est_key, f"{est!r} is not implemented here")
        ours = "grpo"
    norm = g("algorithm.norm_adv_by_std_in_grpo") not in (False, "False", "false")
    if ours == "grpo" and not norm:
        out.set(
            [est_key, "algorithm.norm_adv_by_std_in_grpo"],
            "adv_estimator",
            "dr_grpo",
            "GRPO without the std division (Dr.GRPO)",
        )
    else:
        out.set([est_key], "adv_estimator", ours)
        if "algorithm.norm_adv_by_std_in_grpo" in out.given:
            out.noop(
                "algorithm.norm_adv_by_std_in_grpo",
                "read by grpo only" if ours != "grpo" else "true: GRPO divides by the std",
            )
    out.set(
        [est_key],
        "reward_normalization.method",
        "identity",
        "verl hands the raw scores to the estimator",
    )
    out.set(
        [est_key],
        "whiten_advantages",
        ours == "gae",
        "verl whitens GAE advantages over the batch" if ours == "gae" else "",
    )
    _sum_pi_squared(out, ours)
    out.set(["algorithm.gamma"], "gamma", out.number("algorithm.gamma"))
    if ours == "gae":
        out.set(["algorithm.lam"], "lambd", out.number("algorithm.lam"))
    elif "algorithm.lam" in out.given:
        out.noop("algorithm.lam", "GAE's lambda; read only with adv_estimator=gae")
    # policy loss
    mode = str(g(f"{ACTOR}.policy_loss.loss_mode"))
    variant = vt.POLICY_LOSSES.get(mode)
    if variant is None:
        out.refuse(f"{ACTOR}.policy_loss.loss_mode", f"{mode!r} is not implemented here")
    elif variant != "ppo_clip" or f"{ACTOR}.policy_loss.loss_mode" in out.given:
        out.set([f"{ACTOR}.policy_loss.loss_mode"], "actor_train.pg_variant", variant)
    clip = out.number(f"{ACTOR}.clip_ratio")
    low = g(f"{ACTOR}.clip_ratio_low")
    high = g(f"{ACTOR}.clip_ratio_high")
    low = clip if low is None else float(low)
    high = clip if high is None else float(high)
    keys = [f"{ACTOR}.clip_ratio", f"{ACTOR}.clip_ratio_low", f"{ACTOR}.clip_ratio_high"]
    if low == high:
        out.set(keys, "pg_clip", low, "symmetric clip: no clip-higher")
        out.set(keys, "use_pg_clip_range", False)
    else:
        out.set(keys, "use_pg_clip_range", True, "clip-higher: low != high")
        out.set(keys, "pg_clip_low", low)
        out.set(keys, "pg_clip_high", high)
    c = out.number(f"{ACTOR}.clip_ratio_c")
    if variant == "ppo_clip":
        out.set(
            [f"{ACTOR}.clip_ratio_c"],
            "dual_clip_loss",
            True,
            "verl's vanilla PPO loss is always dual-clip",
        )
        out.set([f"{ACTOR}.clip_ratio_c"], "dual_clip_c", c)
    elif f"{ACTOR}.clip_ratio_c" in out.given:
        out.noop(f"{ACTOR}.clip_ratio_c", f"dual-clip is verl's vanilla loss only, not {mode}")
    agg = str(g(f"{ACTOR}.loss_agg_mode"))
    out.set([f"{ACTOR}.loss_agg_mode"], "loss_agg_mode", agg)
    out.set([f"{ACTOR}.entropy_coeff"], "entropy_loss_coef", out.number(f"{ACTOR}.entropy_coeff"))
    use_kl = g(f"{ACTOR}.use_kl_loss") in (True, "True", "true")
    kl_keys = [f"{ACTOR}.use_kl_loss"]
    out.set(kl_keys, "use_kl_loss", use_kl)
    if use_kl:
        out.set([f"{ACTOR}.kl_loss_coef"], "kl_loss_coef", out.number(f"{ACTOR}.kl_loss_coef"))
        kind = str(g(f"{ACTOR}.kl_loss_type"))
        kind = {"low_var_kl": "k3", "mse": "k2"}.get(kind, kind)
        out.set(
            [f"{ACTOR}.kl_loss_type"],
            "kl_loss_type",
            kind,
            "low_var_kl is k3 (clamped to [-10, 10])",
        )
    else:
        for k in (f"{ACTOR}.kl_loss_coef", f"{ACTOR}.kl_loss_type"):
            if k in out.given:
                out.noop(k, "read only with use_kl_loss=True")
    in_reward = g("algorithm.use_kl_in_reward") in (True, "True", "true")
    out.set(["algorithm.use_kl_in_reward"], "add_token_level_kl", in_reward)
    ctrl = ["algorithm.kl_ctrl.type", "algorithm.kl_ctrl.kl_coef", "algorithm.kl_ctrl.target_kl"]
    if in_reward:
        out.set(["algorithm.kl_ctrl.kl_coef"], "init_kl_coef", out.number(ctrl[1]))
        adaptive = str(g(ctrl[0])) == "adaptive"
        out.set([ctrl[0]], "adaptive_kl_ctrl", adaptive)
        if adaptive:
            out.set([ctrl[2]], "target_kl", out.number(ctrl[2]))
    else:
        for k in ctrl:
            if k in out.given:
                out.noop(k, "read only with algorithm.use_kl_in_reward=True")
    ds = g("algorithm.filter_groups.enable") in (True, "True", "true")
    out.set(
        ["algorithm.filter_groups.enable"],
        "dynamic_sampling.enable",
        ds,
        "DAPO dynamic sampling only when asked",
    )
    if ds:
        rounds = int(g("algorithm.filter_groups.max_num_gen_batches") or 0)
        if rounds > 0:
            out.set(
                ["algorithm.filter_groups.max_num_gen_batches"],
                "dynamic_sampling.max_num_gen_batches",
                rounds,
            )
    elif "algorithm.filter_groups.max_num_gen_batches" in out.given:
        out.noop("algorithm.filter_groups.max_num_gen_batches", "read only with filter_groups")
    out.set(
        ["algorithm.filter_groups.enable"],
        "overlong_penalty.enable",
        False,
        "DAPO's overlong penalty only with reward_manager=dapo",
    )


def _roles(out: Any, dtype: str, prompts: int, n: int, mini: int, world: int) -> None:
    """Reference (when a KL needs it) and critic (GAE)."""
    g = out.get
    mapping = out.data["actor_train"]["device_mapping"]
    need_ref = out.data.get("use_kl_loss") or out.data.get("add_token_level_kl")
    lora = out.data["actor_train"].get("model_args", {}).keys() & {
        "lora_rank",
        "adapter_name_or_path",
    }
    ref_key = f"{A}.ref.fsdp_config.param_offload"
    if need_ref and lora:  # as verl: the actor's base model with its adapter disabled
        for k in (ref_key, f"{A}.ref.fsdp_config.offload_policy"):
            if k in out.given:
                out.noop(k, "with LoRA the reference is the actor's base model (no copy)")
    elif need_ref:
        src = [f"{ACTOR}.use_kl_loss", "algorithm.use_kl_in_reward"]
        out.set(src, "reference.device_mapping", mapping, "verl builds a reference for a KL")
        out.set(src, "reference.strategy_args.strategy_name", "fsdp2_train")
        out.set(["trainer.device"], "reference.model_args.dtype", dtype)
        policy = f"{A}.ref.fsdp_config.offload_policy"
        offload = (_bool(g(ref_key)) or _bool(g(policy))) and dtype != "fp32"
        out.set(
            [ref_key, policy],
            "reference.strategy_args.strategy_config.offload_reference",
            offload,
            "offloaded between uses",
        )
    else:
        for k in (ref_key, f"{A}.ref.fsdp_config.offload_policy"):
            if k in out.given:
                out.noop(k, "no reference without a KL term")
    est = out.data.get("adv_estimator")
    enable = g("critic.enable")
    critic = est == "gae" if enable is None else enable in (True, "True", "true")
    critic_keys = [k for k in out.given if k.startswith("critic.")]
    if not critic:
        for k in critic_keys:
            if k not in out.covered:
                out.noop(k, f"no critic with adv_estimator={est}")
        return
    path = g("critic.model.path")
    if path is None:
        out.refuse("critic.model.path", "required by a critic (adv_estimator=gae)")
        return
    out.set(["critic.model.path"], "critic.model_args.model_name_or_path", str(path))
    out.set(["critic.model.path"], "critic.device_mapping", mapping, "beside the actor")
    c_mini = g("critic.ppo_mini_batch_size")
    _trained_role(out, "critic", "critic", prompts, n, int(c_mini or mini), world, dtype)
    if "critic.enable" in out.given:
        out.noop("critic.enable", "a critic section is written")
    for k in ("critic.ppo_epochs",):
        if k in out.given:
            out.noop(k, "one ppo_epochs for actor and critic (the actor's)")


def _rollout(out: Any, n: int, response_len: int, dtype: str) -> None:
    g = out.get
    name_key = f"{ROLLOUT}.name"
    name = g(name_key)
    if name is None:
        out.refuse(name_key, "required: vllm or hf")
        return
    name = str(name)
    engines = {"vllm": "vllm", "hf": "hf_infer"}
    if name not in engines:
        out.refuse(
            name_key,
            "SGLang is not implemented; vllm or hf"
            if name == "sglang"
            else f"{name!r}: vllm or hf",
        )
        return
    out.set([name_key], "actor_infer.strategy_args.strategy_name", engines[name])
    out.set(["trainer.device"], "actor_infer.model_args.dtype", dtype)
    gen = "actor_infer.generating_args"
    out.set(["data.max_response_length"], f"{gen}.max_new_tokens", response_len)
    out.set([f"{ROLLOUT}.n"], f"{gen}.num_return_sequences", n)
    sampling = {"temperature": float, "top_p": float, "top_k": int, "do_sample": _bool}
    for key, conv in sampling.items():
        out.set([f"{ROLLOUT}.{key}"], f"{gen}.{key}", conv(g(f"{ROLLOUT}.{key}")))
    val = "validation.generating_args"
    vn = out.integer(f"{ROLLOUT}.val_kwargs.n")
    vk = f"{ROLLOUT}.val_kwargs"
    sample = _bool(g(f"{vk}.do_sample"))
    out.set([f"{vk}.n"], "val_n_sample", vn)
    out.set([f"{vk}.n"], f"{val}.num_return_sequences", vn)
    out.set(["data.max_response_length"], f"{val}.max_new_tokens", response_len)
    out.set(
        [f"{vk}.do_sample"],
        f"{val}.do_sample",
        sample,
        "verl validates greedily by default" if not sample else "",
    )
    for key, conv in (("temperature", float), ("top_p", float), ("top_k", int)):
        value = (
            conv(g(f"{vk}.{key}"))
            if sample
            else {"temperature": 0.0, "top_p": 1.0, "top_k": -1}[key]
        )
        out.set([f"{vk}.{key}"], f"{val}.{key}", value)
    options = {
        "gpu_memory_utilization": "gpu_memory_utilization",
        "tensor_model_parallel_size": "tensor_parallel_size",
        "enforce_eager": "enforce_eager",
        "max_num_batched_tokens": "max_num_batched_tokens",
        "max_num_seqs": "max_num_seqs",
        "max_model_len": "max_model_len",
        "enable_chunked_prefill": "enable_chunked_prefill",
        "enable_prefix_caching": "enable_prefix_caching",
    }
    always = ("gpu_memory_utilization", "tensor_model_parallel_size")
    tp_key = f"{ROLLOUT}.tensor_model_parallel_size"
    tp = out.integer(tp_key)
    if name == "vllm" and out.rollout_devices % tp:
        out.refuse(tp_key, f"{tp} does not divide the rollout's {out.rollout_devices} devices")
    sc = "actor_infer.strategy_args.strategy_config"
    for verl, ours in options.items():
        key = f"{ROLLOUT}.{verl}"
        if name != "vllm":
            if key in out.given:
                out.noop(key, "a vLLM option; rollout.name=hf")
            continue
        if key in out.given or verl in always:
            value = g(key)
            if value is not None:
                out.set([key], f"{sc}.{ours}", value, "vLLM option")
            else:
                out.noop(key, "vLLM's default")


def _async(out: Any, mode: str) -> None:
    from rl_config import verl_translate as vt

    g = out.get
    old = [
        k
        for k in (
            "algorithm.rollout_correction.bypass_mode",
            "async_training.use_rollout_log_probs",
            f"{ACTOR}.use_rollout_log_probs",
        )
        if _bool(g(k))
    ]
    is_key = "algorithm.rollout_correction.rollout_is"
    if g(is_key) not in (None, "null", "None") or old:
        threshold = float(g("algorithm.rollout_correction.rollout_is_threshold") or 2.0)
        src = [is_key, "algorithm.rollout_correction.rollout_is_threshold", *old]
        out.set(
            src,
            "train_infer_correction.is_weight.enabled",
            True,
            "the trainer recomputes old log-probs; the IS weight old/rollout corrects toward "
            "the engine's behaviour policy (verl's bypass mode uses the rollout log-probs "
            "as old log-probs)"
            if old
            else "token-level IS weights",
        )
        out.set(src, "train_infer_correction.is_weight.upper_bound", threshold)
    for k in (
        "algorithm.rollout_correction.bypass_mode",
        "async_training.use_rollout_log_probs",
        f"{ACTOR}.use_rollout_log_probs",
        "algorithm.rollout_correction.rollout_is_threshold",
        is_key,
    ):
        if k in out.given and k not in out.covered:
            out.noop(k, "old log-probs are recomputed by the trainer")
    async_keys = [k for k in out.given if k.startswith("async_training.")]
    if mode == "sync":
        for k in async_keys + [k for k in out.given if k.startswith("rollout.")]:
            if k not in out.covered:
                out.refuse(
                    k,
                    "a key of verl's asynchronous recipes; main_ppo does not read it "
                    "(run apps/async --verl -m recipe.fully_async_policy.fully_async_main)",
                )
        return
    if mode == vt.ONE_STEP_OFF:
        out.set([], "async.max_staleness", 1, "one-step-off: rollout one weight version ahead")
        for k in async_keys:
            if k not in out.covered:
                out.refuse(k, "a key of the fully-async recipe; the entry is one-step-off")
        return
    threshold = float(g("async_training.staleness_threshold") or 0)
    staleness = math.ceil(threshold)
    out.set(
        ["async_training.staleness_threshold"],
        "async.max_staleness",
        staleness,
        f"ceil({threshold:g}) weight versions; 0: synchronous",
    )
    partial = _bool(g("async_training.partial_rollout"))
    if staleness and partial:
        out.set(
            ["async_training.partial_rollout"],
            "async.partial_rollout",
            True,
            "a weight update reaches the generations in flight",
        )
    elif "async_training.partial_rollout" in out.given:
        out.noop(
            "async_training.partial_rollout",
            "off" if not partial else "no effect when synchronous (as in verl)",
        )
    # batch-size keys read by the arithmetic above
    for k in ("async_training.trigger_parameter_sync_step", "async_training.require_batches"):
        out.covered.add(k)


RM_KEYS = ("reward_model.model.path", "reward_model.micro_batch_size_per_gpu",
           "reward_model.micro_batch_size", "reward_model.enable_resource_pool")  # fmt: skip


def _reward_model(out: Any) -> bool:
    """verl's `reward_model.enable`: a sequence-classification reward model scores every
    response, and verl's reward manager returns its scores instead of a rule's. Here: the one
    rewards domain `reward_model` (every row is its), on the trainer's devices (verl's global
    pool), `micro_batch_size_per_gpu` responses per forward. Returns whether it is on."""
    g = out.get
    if not _bool(g("reward_model.enable")):
        for key in (*RM_KEYS, "reward_model.rollout.name"):
            if key in out.given:
                out.noop(key, "read only with reward_model.enable")
        return False
    path = g("reward_model.model.path")
    if not path or str(path).startswith("~/models/FsfairX"):  # verl's placeholder default
        out.refuse("reward_model.model.path", "required with reward_model.enable")
    if _bool(g("reward_model.enable_resource_pool")):
        out.refuse(
            "reward_model.enable_resource_pool",
            "the reward model shares the trainer's devices (verl's default pool); a pool of its "
            "own is not translated",
        )
    src = ["reward_model.enable", "reward_model.model.path"]
    d = "rewards.reward_model"
    out.set(src, f"{d}.reward_fn", "reward_model", "scores every response, as verl returns "
            "the reward model's scores instead of the reward function's")  # fmt: skip
    out.set(src, f"{d}.model_args.model_name_or_path", str(path))
    device = str(g("trainer.device") or "cuda").lower()
    out.set(["trainer.device"], f"{d}.model_args.dtype", "fp32" if device == "cpu" else "bf16")
    out.set(["reward_model.enable"], f"{d}.device_mapping",
            out.data["actor_train"]["device_mapping"], "the trainer's devices (verl's global pool)")  # fmt: skip
    micro = [k for k in RM_KEYS[1:3] if g(k) is not None]
    if micro:
        out.set(micro[:1], f"{d}.infer_batch_size", out.integer(micro[0]), "responses per forward")
    loop = g("reward_model.use_reward_loop")  # verl's default: the reward loop
    if (loop is None or _bool(loop)) and g("custom_reward_function.path"):
        from rl_config.verl_rules import GENRM

        out.refuse("custom_reward_function.path", GENRM)
    engine = g("reward_model.rollout.name")
    if "reward_model.rollout.name" in out.given and engine not in (None, "???"):
        out.noop(
            "reward_model.rollout.name",
            f"verl's reward loop serves the reward model with {engine} and reads its one-label "
            "score (a discriminative model); the reward_model domain's worker computes that "
            "score with a forward pass",
        )
    return True


def _reward(out: Any) -> None:
    from rl_config import verl_translate as vt

    g = out.get
    scored_by_model = _reward_model(out)
    manager = g("reward_manager.name") or g("reward_model.reward_manager") or "naive"
    src = [k for k in ("reward_manager.name", "reward_model.reward_manager") if k in out.given]
    if str(manager) not in vt.REWARD_MANAGERS:
        out.refuse(
            src[0] if src else "reward_model.reward_manager",
            f"reward manager {manager!r}: naive, dapo or prime",
        )
    elif src:
        for k in src:
            out.noop(k, MANAGER_NOTES[str(manager)])
    path = g("custom_reward_function.path")
    _sandbox_fusion(out, scored_by_model, bool(path))
    if path and scored_by_model:
        for k in ("custom_reward_function.path", "custom_reward_function.name"):
            if k in out.given:
                out.noop(k, "verl returns the reward model's scores when reward_model.enable")
    elif path:
        out.set(["custom_reward_function.path"], "custom_reward_function.path", str(path))
        out.set(
            ["custom_reward_function.name"],
            "custom_reward_function.name",
            str(g("custom_reward_function.name")),
        )
    elif "custom_reward_function.name" in out.given:
        out.noop("custom_reward_function.name", "read only with custom_reward_function.path")
    if "custom_reward_function.path" in out.given and not path:
        out.noop("custom_reward_function.path", "null: the scorer of each row's data_source")


MANAGER_NOTES = {
    "naive": "the scorer of each row's data_source",
    "dapo": "DAPO's overlong penalty (reward_kwargs.overlong_buffer_cfg)",
    "prime": "rows scored in parallel (verl: a process pool, a failed or timed-out row scores "
    "0): here by the reward router's sandbox workers, concurrently; a failed row is a counted "
    "reward failure",
}
"""verl's reward managers this translation keeps, and what each becomes here."""

CODE_SOURCES = ("codecontests", "apps", "codeforces", "taco")
"""The data sources verl's default scorer sends to the code sandbox (sandbox_fusion.url)."""
SANDBOX = "reward_model.sandbox_fusion"
SANDBOX_MEMORY_MB = 1024
"""The memory limit of a reward sandbox call here (rl_envs.rewards.router.make_reward_pool) and
verl's default memory_limit_mb."""


def _sandbox_fusion(out: Any, scored_by_model: bool, custom: bool) -> None:
    """verl's remote code sandbox (`reward_model.sandbox_fusion.url`): verl's default scorer runs
    the code rows (data_source in `CODE_SOURCES`) against their tests on that server. Here the
    same rows go to the `code_sandbox` domain, whose tests run in the local rl-envs sandbox (no
    network, nothing remote), every other row to `verl_default` (verl's dispatch by data_source).
    A substitution, so each key gets a table row saying so; a memory limit other than this
    sandbox's is refused. verl hands the sandbox only to its default scorer: with a custom reward
    function or a reward model the keys change nothing."""
    g = out.get
    url = g(f"{SANDBOX}.url")
    keys = [f"{SANDBOX}.{k}" for k in ("url", "max_concurrent", "memory_limit_mb")]
    given = [k for k in keys if k in out.given]
    if not url or scored_by_model or custom:
        why = (
            "read only with sandbox_fusion.url"
            if not url
            else "verl hands the sandbox only to its default scorer (here "
            + ("a reward model" if scored_by_model else "custom_reward_function")
            + " scores)"
        )
        for k in given:
            out.noop(k, why)
        return
    out.set([keys[0]], "rewards.verl_default.reward_fn", "verl_default",
            "rows of other data sources: verl's scorer of each row's data_source")  # fmt: skip
    out.set([keys[0]], "rewards.code_sandbox.reward_fn", "code_sandbox",
            f"SUBSTITUTED: verl runs the code rows' tests on the remote sandbox {url}; here they "
            "run in the local rl-envs sandbox (no network). Score: the fraction of the row's "
            "tests passed (verl's remote scorer counts the first 10)")  # fmt: skip
    out.set([keys[0]], "rewards.code_sandbox.tag_included", list(CODE_SOURCES),
            "the data sources verl's default scorer sends to the sandbox")  # fmt: skip
    out.set([keys[0]], "rewards.code_sandbox.timeout_s", 10.0,
            "seconds per test, verl's sandbox default")  # fmt: skip
    if keys[1] in out.given:
        out.noop(keys[1], "concurrent calls to the remote server; the local sandbox pool runs "
                 "its workers concurrently")  # fmt: skip
    memory = g(keys[2])
    if memory is not None and out.integer(keys[2]) != SANDBOX_MEMORY_MB:
        out.refuse(keys[2], f"the local sandbox's memory limit is {SANDBOX_MEMORY_MB} MB")
    elif keys[2] in out.given:
        out.noop(keys[2], f"the local sandbox's memory limit ({SANDBOX_MEMORY_MB} MB)")


def _bool(value: Any) -> bool:
    return value is True or str(value).lower() == "true"
