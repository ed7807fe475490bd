"""Config -> the components of a supervised fine-tuning run (`apps/sft`): the policy trainer and
the data plan.

Pure, like the rest of `rl_runtime.compose`. ROLL's SFT keys are read here and nowhere else:
`prompt_key`, `query_key`, `response_key`, `system_key` (prompt/response rows; chat rows are
`actor_train.data_args.messages`), `global_template` (else `actor_train.data_args.template`),
`validation.data_args.file_name` (held-out rows; its `template`, else the training one),
`actor_train.training_args.num_train_epochs` and `actor_train.use_sequence_packing`. ROLL's
`sft_train` section is read as `actor_train` (rl_config.roll_keys.rename_sft_role).

The batch of one step is ROLL's: `per_device_train_batch_size` rows x
`gradient_accumulation_steps` x ranks, one optimizer step per pipeline step. The number of
steps is ROLL's too: `num_train_epochs` x training rows // rows per step, unless `max_steps` is
set in the config (then `max_steps`, and a `num_train_epochs` set beside it is warned about).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rl_runtime.compose.components import (
    Cadence,
    CheckpointSettings,
    ClusterSettings,
    RolePlan,
    RunComponents,
    TrackerSettings,
)
from rl_runtime.compose.roles import build_role
from rl_runtime.compose.run_settings import (
    build_cadence,
    build_checkpoint,
    build_cluster,
    build_tracker,
    data_files,
)
from rl_runtime.step.sft_data import SFTFields
from rl_train.args import LogprobSampling


@dataclass(frozen=True)
class SFTPlan:
    """The supervised step: the rows, their columns and template, the batch shape."""

    fields: SFTFields
    eval_fields: SFTFields
    """The held-out rows' columns (the training ones, with validation.data_args.template)."""
    train_files: tuple[str, ...]
    eval_files: tuple[str, ...]
    examples_per_step: int
    """Rows per pipeline step, over all ranks."""
    epochs: int
    packed: bool


@dataclass(frozen=True)
class SFTComponents(RunComponents):
    """What `Runner` needs (roles, cadence, checkpoint, tracker, cluster) plus the SFT plan."""

    exp_name: str
    seed: int
    output_dir: str
    pretrain: str | None
    roles: tuple[RolePlan, ...]
    sft: SFTPlan
    cadence: Cadence
    checkpoint: CheckpointSettings
    tracker: TrackerSettings
    cluster: ClusterSettings
    sizes: dict[str, int]
    warnings: tuple[str, ...] = field(default=())
    reference_from_actor: bool = False
    #: SFT trains on a fixed dataset (no rollout): never asynchronous
    asynchronous: ClassVar[None] = None


def build_sft_fields(cfg: Any) -> tuple[SFTFields, SFTFields]:
    """The training rows' plan and the held-out rows' (validation's template when set)."""
    d = cfg.actor_train.data_args
    template = cfg.global_template or d.template
    fields = SFTFields(
        prompt_key=cfg.prompt_key,
        response_key=cfg.response_key,
        query_key=cfg.query_key,
        system_key=cfg.system_key,
        messages_key=d.messages,
        template=template,
        sequence_length=cfg.sequence_length,
    )
    v = cfg.validation
    eval_template = (v.data_args.template if v is not None else None) or template
    return fields, dataclasses.replace(fields, template=eval_template)


def sft_max_steps(cfg: Any, examples_per_step: int, train_rows: int | None) -> int:
    """`max_steps` when the config sets it, else ROLL's `num_train_epochs` x rows // batch
    (at least 1); without a row count (files not there yet) the config's `max_steps`."""
    plain = getattr(cfg, "__wrapped__", cfg)
    if "max_steps" in plain.model_fields_set or train_rows is None:
        return cfg.max_steps
    epochs = cfg.actor_train.training_args.num_train_epochs
    return max(1, epochs * train_rows // examples_per_step)


def compose_sft(
    cfg: Any,
    *,
    device_kind: str = "cpu",
    flash_attn_available: bool = False,
    train_rows: int | None = None,
) -> SFTComponents:
    """The components of an SFT run of `cfg` (a validated `ExperimentConfig`); `train_rows`:
    the training files' row count (ROLL's step count, see the module docstring)."""
    from rl_runtime.compose import refuse_unsupported

    plain = getattr(cfg, "__wrapped__", cfg)
    refuse_unsupported(plain, "sft")
    warnings: list[str] = []
    a = cfg.actor_train
    t = a.training_args
    world = len(a.device_mapping or [0])
    examples = t.per_device_train_batch_size * t.gradient_accumulation_steps * world
    max_steps = sft_max_steps(cfg, examples, train_rows)
    if "max_steps" in plain.model_fields_set and t.num_train_epochs != 1:
        warnings.append(
            f"actor_train.training_args.num_train_epochs={t.num_train_epochs} has no effect: "
            f"max_steps={cfg.max_steps} is set and decides the number of steps"
        )
    r = build_role(
        cfg, "actor_train", examples, device_kind, flash_attn_available, warnings,
        ppo_epochs=1, with_loss=False, logprob_sampling=LogprobSampling(),
    )  # fmt: skip
    assert r.training_args is not None
    role = dataclasses.replace(
        r,
        training_args=dataclasses.replace(
            r.training_args,
            max_steps=max_steps,
            shuffle_mini_batches=False,
            use_sequence_packing=a.use_sequence_packing,
        ),
    )
    fields, eval_fields = build_sft_fields(cfg)
    eval_files = data_files(cfg.validation.data_args.file_name) if cfg.validation else ()
    if cfg.eval_steps and not eval_files:
        warnings.append("eval_steps > 0 without validation.data_args.file_name: no held-out rows")
    return SFTComponents(
        exp_name=cfg.exp_name,
        seed=cfg.seed,
        output_dir=cfg.output_dir,
        pretrain=cfg.pretrain,
        roles=(role,),
        sft=SFTPlan(
            fields=fields,
            eval_fields=eval_fields,
            train_files=data_files(a.data_args.file_name),
            eval_files=eval_files,
            examples_per_step=examples,
            epochs=t.num_train_epochs,
            packed=a.use_sequence_packing,
        ),
        cadence=dataclasses.replace(build_cadence(cfg), max_steps=max_steps),
        checkpoint=build_checkpoint(cfg),
        tracker=build_tracker(cfg, warnings),
        cluster=build_cluster(cfg, sync_bucket_bytes=0),
        sizes={
            "examples_per_step": examples,
            "optimizer_steps_total": max_steps,
            **({"train_rows": train_rows} if train_rows is not None else {}),
        },
        warnings=tuple(warnings),
    )
