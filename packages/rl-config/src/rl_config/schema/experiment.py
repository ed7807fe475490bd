"""The whole experiment: pipeline + algorithm fields, workers, agentic envs and async section."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    model_validator,
)

from rl_config.schema.agentic import CustomEnv, EnvManagerConfig
from rl_config.schema.algorithm import AlgorithmFields
from rl_config.schema.async_ import AsyncConfig
from rl_config.schema.pipeline import PipelineFields
from rl_config.schema.preference import PreferenceFields
from rl_config.schema.rewards import CustomRewardFunction, RewardDomain
from rl_config.schema.sft import SFTFields
from rl_config.schema.validation import ValidationConfig
from rl_config.schema.worker import GeneratingArgs, StrategyArgs, WorkerConfig

WorkerRole = Literal["actor_train", "actor_infer", "reference", "critic"]
DEFAULT_SEQUENCE_LENGTH = 1024
ROLL_GPUS_PER_NODE = 8
"""``num_gpus_per_node`` of a config that lists device ids and leaves it unset (ROLL's default;
ROLL itself reads the machine's device count, 8 on the nodes its examples are written for)."""
DEFAULT_STRATEGY: dict[str, str] = {
    "actor_train": "fsdp2_train",
    "critic": "fsdp2_train",
    "actor_infer": "hf_infer",
    "reference": "hf_infer",
}


class RuleViolations(ValueError):
    """Raised inside validation with every cross-field issue; unwrapped into ConfigError."""

    def __init__(self, issues: list[Any]):
        self.issues = issues
        super().__init__("; ".join(str(i) for i in issues))


class ExperimentConfig(AlgorithmFields, PipelineFields, PreferenceFields, SFTFields):
    """A complete, validated experiment config (ROLL-compatible key names).

    Build it with ``ExperimentConfig.model_validate(mapping)`` or ``rl_config.load_config(path)``;
    both raise ``rl_config.ConfigError`` listing every problem. After validation the derived values
    are filled in: each worker's ``strategy_args``, ``model_args.model_name_or_path``,
    ``world_size``, ``sequence_length`` and ``async.max_staleness``.
    """

    actor_train: WorkerConfig = Field(
        default_factory=WorkerConfig, description="The policy being trained."
    )
    actor_infer: WorkerConfig = Field(
        default_factory=WorkerConfig, description="The policy's generation engines (rollout)."
    )
    reference: WorkerConfig = Field(
        default_factory=WorkerConfig,
        description="Frozen reference policy for KL (used when init_kl_coef > 0 or use_kl_loss).",
    )
    critic: WorkerConfig | None = Field(
        default=None, description="Value model (PPO with adv_estimator gae); unset: no critic."
    )
    train_env_manager: EnvManagerConfig | None = Field(
        default=None, description="Training env population (agentic pipelines); unset: not agentic."
    )
    val_env_manager: EnvManagerConfig | None = Field(
        default=None, description="Validation env population (agentic); unset: no env validation."
    )
    custom_envs: dict[str, CustomEnv] = Field(
        default_factory=dict,
        description="Env definitions by tag, e.g. SimpleSokoban: ${custom_env.SimpleSokoban}.",
    )
    rewards: dict[str, RewardDomain] = Field(
        default_factory=dict,
        description="RLVR reward domains (ROLL rewards): domain name -> its reward and the row "
        "tags it scores, e.g. math_rule: {worker_cls: ...MathRuleRewardWorker, tag_included: "
        "[gsm8k]}. Empty: every row is scored by custom_reward_function, else by verl's "
        "default dispatch on data_source. Rewards run in the rl-envs sandbox.",
    )
    validation: ValidationConfig | None = Field(
        default=None,
        description="RLVR held-out prompts and their sampling (ROLL's validation section: "
        "data_args.file_name, data_args.template, generating_args); unset: "
        "actor_train.data_args.eval_file_name with the training sampling.",
    )
    custom_reward_function: CustomRewardFunction = Field(
        default_factory=CustomRewardFunction,
        description="verl's user reward function (RLVR): path and name of a Python function.",
    )
    async_generation_ratio: float = Field(
        default=0.0,
        ge=0,
        description="ROLL's async knob, in rollout batches: rollout may run this many batches "
        "ahead of training; 0 = synchronous. Sets async.max_staleness = ceil(ratio) when unset.",
    )
    async_: AsyncConfig = Field(
        default_factory=AsyncConfig,
        alias="async",
        description="Asynchronous training bounds (staleness in weight versions, queue in samples).",
    )

    _roll_notes: list[Any] = PrivateAttr(default_factory=list)
    _pipeline_kind: str = PrivateAttr(default="rlvr")

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> ExperimentConfig:
        """Validate a mapping; raises ``rl_config.ConfigError`` with every problem found."""
        from rl_config.diagnostics import config_error_from_validation

        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            raise config_error_from_validation(exc, cls) from None

    @model_validator(mode="wrap")
    @classmethod
    def _roll_compat(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> ExperimentConfig:
        """Refuse configs of ROLL pipelines this stack lacks, Megatron configs and verl keys (one
        error each, naming its ROLL counterpart); drop ROLL's accepted-but-unimplemented keys
        (with notes)."""
        from rl_config.roll_keys import (
            pipeline_or_megatron_issue,
            rename_sft_role,
            sft_role_issue,
            strip_roll_keys,
            unsupported_values,
        )
        from rl_config.verl_keys import verl_key_issues

        if not isinstance(data, dict):
            return handler(data)
        issue = sft_role_issue(data)
        if issue is not None:
            raise RuleViolations([issue])
        data, sft_notes = rename_sft_role(data)
        issue = pipeline_or_megatron_issue(data)
        if issue is not None:
            raise RuleViolations([issue])
        from rl_config.contract import changes_what_is_trained

        refused = verl_key_issues(data) + unsupported_values(data) + changes_what_is_trained(data)
        if refused:
            raise RuleViolations(refused)
        data, notes = strip_roll_keys(data)
        cfg = handler(data)
        cfg._roll_notes = sft_notes + notes
        return cfg

    # ----------------------------------------------------------------------------- derived values
    @model_validator(mode="after")
    def _derive_and_check(self) -> ExperimentConfig:
        from rl_config.roll_keys import pipeline_kind
        from rl_config.rules import check_rules

        # before the rules: they check only what the config's pipeline reads (DPO: no actor_infer)
        self._pipeline_kind = pipeline_kind({k: getattr(self, k) for k in self.model_fields_set})
        self._derive()
        issues = check_rules(self)
        if issues:
            raise RuleViolations(issues)
        return self

    def _derive(self) -> None:
        self._derive_num_nodes()
        for role, worker in self.workers().items():
            if worker.strategy_args is None:
                worker.strategy_args = StrategyArgs(strategy_name=DEFAULT_STRATEGY[role])
            if worker.strategy_args.strategy_config is None:
                worker.strategy_args.strategy_config = {}
            if worker.model_args.model_name_or_path is None:
                default = (
                    (self.reward_pretrain or self.pretrain) if role == "critic" else self.pretrain
                )
                worker.model_args.model_name_or_path = default
            if worker.strategy_args.strategy_name == "vllm":
                cfg = worker.strategy_args.strategy_config
                tp = cfg.get("tensor_parallel_size", 1)
                pp = cfg.get("pipeline_parallel_size", 1)
                if isinstance(tp, int) and isinstance(pp, int) and worker.num_gpus_per_worker == 1:
                    worker.num_gpus_per_worker = tp * pp
            if worker.device_mapping and worker.world_size is None:
                worker.world_size = max(1, len(worker.device_mapping) // worker.num_gpus_per_worker)
            elif worker.world_size is None:
                worker.world_size = 1
        if self.actor_infer.generating_args is None:
            self.actor_infer.generating_args = GeneratingArgs()
        if self.sequence_length is None:
            if self.prompt_length is not None and self.response_length is not None:
                self.sequence_length = self.prompt_length + self.response_length
            else:
                self.sequence_length = DEFAULT_SEQUENCE_LENGTH
        if self.async_.max_staleness is None:
            self.async_.max_staleness = math.ceil(self.async_generation_ratio)
        if self.async_.queue_size is None and self.async_.max_staleness > 0:
            self.async_.queue_size = self.samples_per_step * self.async_.max_staleness

    def _derive_num_nodes(self) -> None:
        """Unset num_gpus_per_node with device ids given: ROLL's 8 (see the field). Unset
        num_nodes: as many nodes as the highest device id needs (ROLL does the same)."""
        from rl_config.errors import ConfigIssue

        ids = [d for w in self.workers().values() for d in (w.device_mapping or [])]
        if ids and "num_gpus_per_node" not in self.model_fields_set:
            self.num_gpus_per_node = ROLL_GPUS_PER_NODE
            self._roll_notes.append(
                ConfigIssue(
                    "num_gpus_per_node",
                    f"not set; taken as {ROLL_GPUS_PER_NODE}, ROLL's default, since roles list "
                    "device ids (ROLL reads the machine's device count); set it to the devices "
                    "of one node to confirm",
                )
            )
        if "num_nodes" in self.model_fields_set or not ids or max(ids) < self.total_devices:
            return  # an explicit num_nodes that is too small is an error (check_devices)
        self.num_nodes = math.ceil((max(ids) + 1) / self.num_gpus_per_node)
        self._roll_notes.append(
            ConfigIssue(
                "num_nodes",
                f"not set; derived as {self.num_nodes} from device id {max(ids)} and "
                f"num_gpus_per_node {self.num_gpus_per_node} (as ROLL does); set it to confirm",
            )
        )

    # ------------------------------------------------------------------------------- properties
    def workers(self) -> dict[WorkerRole, WorkerConfig]:
        """The configured worker roles (critic only when set), in placement order."""
        roles: dict[WorkerRole, WorkerConfig] = {
            "actor_train": self.actor_train,
            "actor_infer": self.actor_infer,
            "reference": self.reference,
        }
        if self.critic is not None:
            roles["critic"] = self.critic
        return roles

    @property
    def is_agentic(self) -> bool:
        """True when a train_env_manager is configured (multi-turn env rollouts)."""
        return self.train_env_manager is not None

    @property
    def pipeline_kind(self) -> str:
        """agentic (train_env_manager set), dpo (ROLL DPO keys present), sft (ROLL SFT keys or
        an `sft_train` section) or rlvr."""
        return "agentic" if self.is_agentic else self._pipeline_kind

    @property
    def samples_per_step(self) -> int:
        """Samples (sequences) trained on per pipeline step.

        Agentic: rollout_batch_size trajectories. RLVR: rollout_batch_size prompts ×
        num_return_sequences_in_group."""
        if self.is_agentic:
            return self.rollout_batch_size
        return self.rollout_batch_size * self.num_return_sequences_in_group

    @property
    def enable_reference(self) -> bool:
        """Whether reference log-probs are needed (KL penalty in reward or KL loss)."""
        return self.init_kl_coef > 0 or self.use_kl_loss

    @property
    def kl_controller(self) -> Literal["fixed", "adaptive"]:
        """KL controller kind: adaptive_kl_ctrl if set, else adaptive iff target_kl is set."""
        if self.adaptive_kl_ctrl is not None:
            return "adaptive" if self.adaptive_kl_ctrl else "fixed"
        return "adaptive" if self.target_kl is not None else "fixed"

    @property
    def policy_loss(self) -> str:
        """Policy loss name (actor_train.pg_variant, default ppo_clip)."""
        return self.actor_train.pg_variant or "ppo_clip"

    @property
    def is_async(self) -> bool:
        """True when rollout may run ahead of training (max_staleness > 0)."""
        return (self.async_.max_staleness or 0) > 0

    @property
    def total_devices(self) -> int:
        """num_nodes × num_gpus_per_node."""
        return self.num_nodes * self.num_gpus_per_node

    @property
    def checkpoint_dir(self) -> str:
        """checkpoint_config.output_dir, or <output_dir>/checkpoints."""
        return self.checkpoint_config.output_dir or f"{self.output_dir.rstrip('/')}/checkpoints"

    def config_warnings(self) -> list[str]:
        """Legal but suspicious settings, as readable lines (printed by ``rl-config check``)."""
        from rl_config.rules import collect_warnings

        return [str(note) for note in self._roll_notes] + collect_warnings(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain mapping (YAML-safe builtins) with YAML key names (``async``, not ``async_``).

        Python mode keeps integer keys (e.g. an env's ``grid_lookup``) so it round-trips."""
        return self.model_dump(mode="python", by_alias=True)
