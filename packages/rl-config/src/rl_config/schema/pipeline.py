"""Pipeline fields: experiment identity, outputs, tracking, step counts, batch sizes, devices."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from rl_config.schema.base import StrictModel
from rl_config.schema.worker import stringify_env_values

#: `record_steps` anomaly triggers, by name: what each detects (K: a number of standard
#: deviations, > 0; the window: the previous `RECORD_WINDOW` finite values of the same role,
#: at least `RECORD_MIN_HISTORY` of them)
RECORD_TRIGGERS = {
    "nonfinite": "a NaN/inf loss or grad norm, or a skipped optimizer step",
    "spike": "spike:K, a loss or grad norm more than K standard deviations from its window's mean",
    "reward_collapse": "reward_collapse:K, a step's mean reward more than K standard deviations "
    "below its window's mean",
}
RECORD_WINDOW = 20
RECORD_MIN_HISTORY = 5

RecordSteps = tuple[str, int, tuple[tuple[str, float], ...]]


def parse_record_steps(value: str) -> RecordSteps:
    """`record_steps` as `(kind, every, triggers)`: ("none", 0, ()), ("every", N, ()) or
    ("anomaly", 0, ((name, K), ...)) for one or more of `nonfinite`, `spike:K`,
    `reward_collapse:K` joined by `+` (K 0.0 for nonfinite). A ValueError names a malformed
    value."""
    text = value.strip()
    kind, _, arg = text.partition(":")
    if text == "none":
        return "none", 0, ()
    if kind == "every":
        if arg.strip().isdigit() and int(arg) >= 1:
            return "every", int(arg), ()
        raise ValueError(f"record_steps={value!r}: every:N needs an integer N >= 1")
    triggers: dict[str, float] = {}
    for part in text.split("+"):
        name, sep, raw = part.strip().partition(":")
        if name not in RECORD_TRIGGERS:
            raise ValueError(
                f"record_steps={value!r}: {part.strip()!r} is not a trigger; expected none, "
                f"every:N, or triggers joined by '+': {'; '.join(RECORD_TRIGGERS.values())}"
            )
        if name in triggers:
            raise ValueError(f"record_steps={value!r}: {name} given twice")
        if name == "nonfinite":
            if sep:
                raise ValueError(f"record_steps={value!r}: nonfinite takes no argument")
            triggers[name] = 0.0
            continue
        try:
            k = float(raw)
        except ValueError:
            k = float("nan")
        if not sep or not (0.0 < k < float("inf")):
            raise ValueError(
                f"record_steps={value!r}: {name}:K needs K, a number of standard deviations > 0"
            )
        triggers[name] = k
    return "anomaly", 0, tuple(triggers.items())


class CheckpointConfig(StrictModel):
    """Where checkpoints go (ROLL ``checkpoint_config``)."""

    type: Literal["file_system"] = Field(
        default="file_system", description="Storage kind; only file_system is supported."
    )
    output_dir: str | None = Field(
        default=None, description="Checkpoint directory; unset: <output_dir>/checkpoints."
    )
    key_file: str | None = Field(
        default=None,
        description="File holding the secret that signs checkpoint manifests (HMAC-SHA256); "
        "a checkpoint loads only if its signature verifies with it. Keep it outside the "
        "checkpoint directory, mode 0600; created on first use. Unset: $RL_CHECKPOINT_KEY_FILE, "
        "else ~/.config/rl-stack/checkpoint.key.",
    )


class PipelineFields(StrictModel):
    """Top-level pipeline keys (ROLL BaseConfig/ScheduleConfig)."""

    exp_name: str = Field(
        default="rl_experiment",
        min_length=1,
        description="Experiment name; used in output and log paths.",
    )
    seed: int = Field(
        default=42, description="Global random seed (model init, env seeds, sampling)."
    )
    rpc_timeout: int = Field(
        default=3600, ge=1, description="Timeout of a remote call between workers, in seconds."
    )
    max_failed_fraction: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Largest fraction of a training batch's episodes that may fail (env or engine "
        "error, env step timeout, reward function failure) before training stops with an error. "
        "Failed episodes are never trained on: they are dropped from the batch and counted in "
        "the failures/* metrics. 1.0: never stop (a batch with no episode left still stops).",
    )
    output_dir: str = Field(
        default="./output", description="Directory of run outputs (resolved config, exports)."
    )
    logging_dir: str = Field(default="./output/logs", description="Directory of log files.")
    render_save_dir: str | None = Field(
        default=None,
        description="Directory for rendered env frames of validation episodes; unset: off.",
    )
    track_with: Literal["stdout", "tensorboard", "wandb"] = Field(
        default="stdout", description="Metrics tracker: stdout, tensorboard or wandb."
    )
    tracker_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of the tracker (tensorboard: log_dir; wandb: project, name, "
        "tags, api_key ...). Secrets are redacted in dumps.",
    )
    max_steps: int = Field(
        default=100, ge=1, description="Pipeline steps (rollout + train) to run."
    )
    save_steps: int = Field(
        default=50,
        ge=1,
        description="Save a checkpoint every save_steps pipeline steps (and at the end).",
    )
    record_steps: str = Field(
        default="none",
        description="Record learn calls for `rl-replay` under <output_dir>/records/step-<N>/: "
        "none; every:N (every N-th step, its trainer state saved just before it; every:1 saves "
        "it every 50 steps and replays the records since); or anomaly "
        "triggers joined by '+': nonfinite (a NaN/inf loss or grad norm, or a skipped optimizer "
        "step), spike:K (a loss or grad norm more than K standard deviations from the mean of "
        "the role's previous 20 finite values, 5 at least), reward_collapse:K (a step's mean "
        "reward more than K standard deviations below the previous 20 steps' mean). nonfinite "
        "and spike save the state before every step (a checkpoint write per step) and keep it "
        "only for a recorded step; reward_collapse alone saves it only for a collapsed step.",
    )
    max_ckpt_to_keep: int = Field(
        default=0, ge=0, description="Checkpoints kept on disk, newest first; 0 = keep all."
    )
    logging_steps: int = Field(
        default=1, ge=1, description="Log metrics every logging_steps steps."
    )
    eval_steps: int = Field(
        default=10, ge=0, description="Run validation every eval_steps steps; 0 = never."
    )
    resume_from_checkpoint: bool | str = Field(
        default=False,
        description="false: start fresh; true: resume from the newest checkpoint of the "
        "checkpoint dir; a path: resume from that checkpoint.",
    )
    sandbox_allow_weak_isolation: bool = Field(
        default=False,
        description="Let untrusted code (reward functions, tool code) run where the host "
        "refuses network namespaces (e.g. Docker's default seccomp profile) or the sandbox's "
        "seccomp socket filter (a machine other than x86_64/aarch64). The sandbox then only "
        "patches Python's socket module, which a subprocess bypasses; false: refuse.",
    )
    checkpoint_config: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoint storage."
    )
    pretrain: str | None = Field(
        default=None,
        description="Policy model (local path or hub id); default model of actor_train, "
        "actor_infer and reference.",
    )
    reward_pretrain: str | None = Field(
        default=None, description="Critic/reward model path; unset: pretrain."
    )
    rollout_batch_size: int = Field(
        default=8,
        ge=1,
        description="Per pipeline step. Agentic: trajectories (samples). RLVR: prompts; samples "
        "per step = rollout_batch_size × num_return_sequences_in_group.",
    )
    val_batch_size: int = Field(
        default=8,
        ge=1,
        description="Per validation run. Agentic: trajectories (samples). RLVR: prompts.",
    )
    val_n_sample: int = Field(
        default=1,
        ge=1,
        description="RLVR: samples per held-out prompt in validation (pass@k with k = "
        "val_n_sample, sampled like training).",
    )
    val_greedy: bool = Field(
        default=False,
        description="RLVR: also validate with greedy decoding (one sample per prompt).",
    )
    prompt_length: int | None = Field(
        default=None,
        ge=1,
        description="Prompt tokens at most (RLVR; a longer prompt: prompt_truncation).",
    )
    prompt_truncation: Literal["drop", "left", "right", "middle"] = Field(
        default="drop",
        description="RLVR: a prompt longer than prompt_length is dropped and counted (drop), "
        "or keeps its last (left), first (right) or first and last halves (middle) "
        "prompt_length tokens, counted too (verl's data.truncation).",
    )
    response_length: int | None = Field(
        default=None, ge=1, description="Response tokens at most (RLVR)."
    )
    sequence_length: int | None = Field(
        default=None,
        ge=2,
        description="Tokens per training sequence at most (prompt + all turns). Unset: "
        "prompt_length + response_length when both are set, else 1024.",
    )
    max_tokens_per_step: int | None = Field(
        default=None,
        ge=1,
        description="Default per-turn token budget; env definitions reference it as "
        "${max_tokens_per_step}.",
    )
    num_return_sequences_in_group: int = Field(
        default=1, ge=1, description="RLVR: samples per prompt (G)."
    )
    num_nodes: int = Field(default=1, ge=1, description="Machines in the cluster.")
    num_gpus_per_node: int = Field(
        default=1,
        ge=1,
        description="Accelerators (GPUs or NPUs) per machine. Unset: 8 (ROLL's default, with a "
        "warning) when a role lists device_mapping ids, else 1 (every role on the CPU).",
    )
    node_resources: list[str] | None = Field(
        default=None,
        description="Ray custom resource that marks each node, in node order (one name per "
        "num_nodes): the devices of node n (ids n*num_gpus_per_node .. "
        "(n+1)*num_gpus_per_node-1) are reserved only on a Ray node that advertises "
        "node_resources[n], so device_mapping pins roles to nodes (e.g. training on one node, "
        "rollout on another). Start node n with `ray start --resources '{\"<name>\": 1}'`. "
        "Unset: Ray places every device bundle on any node.",
    )
    weight_sync_host: str | None = Field(
        default=None,
        description="Address the trainer's node listens on for the trainer -> rollout weight "
        "sync (its TCP store and collective). Unset: 127.0.0.1 when the trainer and every "
        "rollout worker share a node, else the trainer node's Ray IP.",
    )
    weight_sync_transport: Literal["auto", "broadcast", "shared_memory"] = Field(
        default="auto",
        description="How the trainer's weights reach the rollout engines (Ray runs). "
        "broadcast: buckets of model_update_buffer_size_mb over the sync group (any layout). "
        "shared_memory: the CPU trainer writes the weights once into a /dev/shm buffer and the "
        "engines on its node copy them from there (refused where a rollout worker is on another "
        "node, the trainer is on an accelerator or /dev/shm lacks room). auto: shared_memory "
        "where it can work, else broadcast.",
    )
    system_envs: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables set in every worker process (secrets redacted in "
        "dumps). OMP_NUM_THREADS here sets each worker's torch threads (unset: the whole CPUs "
        "its bundle reserves, at least 1).",
    )
    local_rank: int = Field(default=-1, description="Set by launchers; -1 when not distributed.")
    generate_opt_level: Literal[0, 1] = Field(
        default=1,
        description="0: batch generate; 1: request scheduler (needed for async and agentic).",
    )
    is_num_return_sequences_expand: bool = Field(
        default=False,
        description="Replicate each prompt n times instead of asking the engine for n samples.",
    )
    max_running_requests: int = Field(
        default=128, ge=1, description="Concurrent generation requests per engine at most."
    )
    is_use_additional_prompts: bool = Field(
        default=False, description="Run extra prompts beyond the batch (to absorb dropped groups)."
    )
    max_additional_running_prompts: int = Field(
        default=16, ge=0, description="Extra prompts in flight beyond the batch at most."
    )
    model_update_buffer_size_mb: int = Field(
        default=1024,
        ge=1,
        description="Bucket size of the trainer -> engine weight transfer, in MiB (the "
        "broadcast transport; shared memory moves the weights in one buffer).",
    )
    is_offload_states: bool = Field(
        default=False,
        description="Offload model/optimizer states to CPU between phases (colocation).",
    )

    @field_validator("system_envs", mode="before")
    @classmethod
    def _stringify_envs(cls, value: Any) -> Any:
        return stringify_env_values(value)

    @field_validator("system_envs", mode="after")
    @classmethod
    def _thread_count(cls, value: dict[str, str]) -> dict[str, str]:
        threads = value.get("OMP_NUM_THREADS")
        if threads is not None and not (threads.strip().isdigit() and int(threads) >= 1):
            raise ValueError(
                f"OMP_NUM_THREADS={threads!r}: expected a whole number >= 1 (the torch threads "
                "of every worker; unset: the whole CPUs of the worker's bundle)"
            )
        return value

    @field_validator("record_steps", mode="after")
    @classmethod
    def _record_steps(cls, value: str) -> str:
        parse_record_steps(value)
        return value

    @field_validator("resume_from_checkpoint", mode="before")
    @classmethod
    def _resume_value(cls, value: Any) -> Any:
        if value is None:
            return False
        if isinstance(value, str) and not value.strip():
            raise ValueError("an empty path; use false to start fresh or a checkpoint path")
        return value
