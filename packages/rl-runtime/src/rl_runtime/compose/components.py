"""The record `compose` returns: typed plans of every part of a run (frozen, printable)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from rl_config.records import SamplingParams
from rl_runtime.compose.async_plan import AsyncPlan
from rl_runtime.state.seeds import batch_sampling_seed
from rl_runtime.step.advantages import AdvantageConfig, KLControlConfig
from rl_train.args import ModelArgs, TrainingArgs
from rl_train.losses import ActorLossConfig, CriticLossConfig

BACKEND_ROLE = {"actor_train": "actor", "critic": "critic", "reference": "reference"}
"""Training roles -> the rl-train backend role they run."""


@dataclass(frozen=True)
class RolePlan:
    """One role: devices, backend, model and (training roles) optimiser, model args and loss."""

    role: str
    device_mapping: tuple[int, ...]
    devices_per_worker: int
    strategy_name: str
    strategy_config: dict[str, Any]
    model_path: str | None
    dtype: str
    training_args: TrainingArgs | None = None
    model_args: ModelArgs | None = None
    loss: ActorLossConfig | CriticLossConfig | None = None
    #: a model reward's role (rl_runtime.compose.model_rewards): llm_judge | reward_model
    reward: str | None = None
    #: its chat template (data_args.template)
    template: str | None = None
    #: the rl-train backend role of a role outside `BACKEND_ROLE` (a distillation teacher runs
    #: `reference`: log-probs only); None: `BACKEND_ROLE[role]`
    backend: str | None = None
    #: the config key naming this role's model where `model_key`'s rule does not apply
    model_config_key: str | None = None
    #: HF model config attributes the role's model is built with (model_args.model_config_kwargs)
    config_overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def trains(self) -> bool:
        return self.role in BACKEND_ROLE

    @property
    def model_key(self) -> str:
        """The config key that names this role's model (a model reward's: its domain's)."""
        if self.model_config_key is not None:
            return self.model_config_key
        if self.reward is not None:  # role reward_<domain>
            return f"rewards.{self.role.removeprefix('reward_')}.model_args.model_name_or_path"
        return f"{self.role}.model_args.model_name_or_path"


@dataclass(frozen=True)
class EnvManagerPlan:
    """Which envs a split plays: tags, groups x group_size, episodes per step (train)."""

    tags: tuple[str, ...]
    num_env_groups: int
    group_size: int
    num_groups_partition: tuple[int, ...] | None
    num_episodes: int | None


@dataclass(frozen=True)
class EnvSpec:
    """One env definition by tag: registry type and constructor options."""

    env_type: str
    config: dict[str, Any]


@dataclass(frozen=True)
class AgentPlan:
    """AgentLoop options of the rollout workers."""

    max_tokens_per_step: int
    max_running_requests: int
    max_sequence_length: int


@dataclass(frozen=True)
class Cadence:
    max_steps: int
    logging_steps: int
    eval_steps: int
    save_steps: int
    #: `record_steps`: (kind, every, triggers) of rl_config.schema.pipeline.parse_record_steps
    record_steps: tuple[str, int, tuple[tuple[str, float], ...]] = ("none", 0, ())


@dataclass(frozen=True)
class CheckpointSettings:
    directory: str
    keep_last: int | None
    resume: bool | str
    key_file: str | None  # signs/verifies manifests; None: rl_train.signing.default_key_file()


@dataclass(frozen=True)
class TrackerSettings:
    track_with: str
    log_dir: str
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class ClusterSettings:
    num_devices: int
    rpc_timeout: float
    system_envs: dict[str, str]
    sync_bucket_bytes: int
    devices_per_node: int = 1
    #: Ray custom resource per node (pins device bundles to nodes); None: no pinning
    node_resources: tuple[str, ...] | None = None
    #: address of the weight-sync store on the trainer's node; None: chosen from the nodes
    sync_host: str | None = None
    #: `weight_sync_transport`: auto | broadcast | shared_memory (rl_runtime.cluster.sync_transport)
    sync_transport: str = "auto"


class RunComponents(Protocol):
    """What the Runner, its Context and the cluster read of a pipeline's components: every
    pipeline's components class subclasses it (`Components`: agentic and RLVR; DPO's
    `DPOComponents`), adding its own plan."""

    exp_name: str
    seed: int
    output_dir: str
    pretrain: str | None
    roles: tuple[RolePlan, ...]
    cadence: Cadence
    checkpoint: CheckpointSettings
    tracker: TrackerSettings
    cluster: ClusterSettings
    sizes: dict[str, int]
    warnings: tuple[str, ...]
    asynchronous: AsyncPlan | None
    """Rollout running ahead of training (None: synchronous; rl_runtime.asynchrony.training)."""
    reference_from_actor: bool

    def role(self, name: str) -> RolePlan | None:
        return next((r for r in self.roles if r.role == name), None)


@dataclass(frozen=True)
class Components(RunComponents):
    """Everything a run is built from (see module docstring); `--dry-run` prints it."""

    exp_name: str
    seed: int
    output_dir: str
    render_dir: str | None
    pretrain: str | None
    roles: tuple[RolePlan, ...]
    advantage: AdvantageConfig
    kl: KLControlConfig
    base_sampling: SamplingParams
    train_envs: EnvManagerPlan | None
    val_envs: EnvManagerPlan | None
    env_specs: dict[str, EnvSpec]
    agent: AgentPlan
    sequence_length: int
    cadence: Cadence
    checkpoint: CheckpointSettings
    tracker: TrackerSettings
    cluster: ClusterSettings
    sizes: dict[str, int]
    max_failed_fraction: float = 0.5
    """Stop training when a batch has a larger share of failed episodes (rl_runtime.step.failures)."""
    sandbox_allow_weak_isolation: bool = False
    """Let untrusted reward/tool code run without network namespaces (rl-envs sandbox)."""
    warnings: tuple[str, ...] = field(default=())
    asynchronous: AsyncPlan | None = None
    """Rollout running ahead of training (None: synchronous; rl_runtime.asynchrony.training)."""
    reference_from_actor: bool = False
    """The reference log-probs are actor_train's with its LoRA adapter disabled (the reference
    is its base model; no reference worker: rl_runtime.compose.lora.reference_from_actor)."""

    def sampling(self, split: str, epoch: int, greedy: bool = False) -> SamplingParams:
        """Sampling of one rollout batch: the configured params (greedy when `greedy` or
        `do_sample: false`), a seed from (seed, epoch, split)."""
        seed = batch_sampling_seed(self.seed, split, epoch)
        params = msgspec.structs.replace(self.base_sampling, seed=seed)
        if greedy:
            params = msgspec.structs.replace(params, temperature=0.0, top_p=1.0, top_k=-1)
        return params
