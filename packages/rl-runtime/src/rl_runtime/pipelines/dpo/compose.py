"""Config -> the components of an offline preference run (`apps/dpo`): the policy trainer, a
reference worker when the loss needs one, the preference loss and the data plan.

Pure, like the rest of `rl_runtime.compose`. ROLL's DPO keys (`ipo`, `beta`, `label_smoothing`,
`chosen_key`, `rejected_key`) and TRL's `loss_type` are read here and nowhere else. The batch of
one step is ROLL's: `per_device_train_batch_size` pairs x `gradient_accumulation_steps` x ranks,
one optimizer step per pipeline step (gradient accumulation over the full batch);
`rollout_batch_size` is not used.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from rl_runtime.compose.components import (
    Cadence,
    CheckpointSettings,
    ClusterSettings,
    RolePlan,
    RunComponents,
    TrackerSettings,
)
from rl_runtime.compose.lora import reference_from_actor
from rl_runtime.compose.roles import build_role
from rl_runtime.compose.run_settings import (
    build_cadence,
    build_checkpoint,
    build_cluster,
    build_tracker,
    data_files,
)
from rl_train.args import LogprobSampling
from rl_train.preference import PreferenceLossConfig

PACKED_KERNELS = ("flash_attention_2", "rl_varlen")
"""Attention kernels with a padding-free varlen path: chosen and rejected then run as one packed
stream (with sdpa/eager a packed stream needs an [N, N] block mask, slower than padding)."""


@dataclass(frozen=True)
class PreferenceData:
    """Where the preference rows come from and how they become token rows."""

    train_files: tuple[str, ...]
    eval_files: tuple[str, ...]
    prompt_key: str
    messages_key: str | None
    chosen_key: str
    rejected_key: str
    label_key: str
    completion_key: str
    template: str
    sequence_length: int
    truncation_mode: str


@dataclass(frozen=True)
class PreferencePlan:
    """The preference step: loss, reference mode, batch shape."""

    loss: PreferenceLossConfig
    reference: Literal["cached", "on_the_fly", "none"]
    examples_per_step: int
    """Pairs (paired losses) or rows (kto) per pipeline step, over all ranks."""
    rows_per_example: int
    """2 for paired losses (chosen + rejected rows), 1 for kto."""
    data: PreferenceData


@dataclass(frozen=True)
class DPOComponents(RunComponents):
    """What `Runner` needs (roles, cadence, checkpoint, tracker, cluster) plus the preference plan."""

    exp_name: str
    seed: int
    output_dir: str
    pretrain: str | None
    roles: tuple[RolePlan, ...]
    preference: PreferencePlan
    cadence: Cadence
    checkpoint: CheckpointSettings
    tracker: TrackerSettings
    cluster: ClusterSettings
    sizes: dict[str, int]
    warnings: tuple[str, ...] = field(default=())
    #: the reference log-probs are actor_train's with its LoRA adapter disabled (no reference
    #: worker: rl_runtime.compose.lora.reference_from_actor)
    reference_from_actor: bool = False
    #: DPO trains on a fixed dataset (no rollout): never asynchronous
    asynchronous: ClassVar[None] = None


def build_preference_loss(cfg: Any) -> PreferenceLossConfig:
    """`loss_type` (ROLL's `ipo: true` = ipo) and its options."""
    name = cfg.loss_type
    if cfg.ipo:
        if name not in ("sigmoid", "ipo"):
            raise ValueError(f"ipo: true contradicts loss_type={name!r} (use one of them)")
        name = "ipo"
    return PreferenceLossConfig(
        loss_type=name,
        beta=cfg.beta,
        label_smoothing=cfg.label_smoothing,
        simpo_gamma=cfg.simpo_gamma,
        kto_desirable_weight=cfg.kto_desirable_weight,
        kto_undesirable_weight=cfg.kto_undesirable_weight,
    )


def unread_preference_keys(cfg: Any, loss: PreferenceLossConfig) -> list[str]:
    """A warning for each preference key set away from its default that `loss` never reads:
    an option of another loss type (label_smoothing with ipo, simpo_gamma with sigmoid, kto_*
    weights with a paired loss), KTO's unpaired-row columns with a paired loss, and
    precompute_ref_log_probs with a reference-free loss (simpo, orpo)."""
    fields = type(getattr(cfg, "__wrapped__", cfg)).model_fields
    keys = list(loss.unread_fields())
    if loss.paired:
        keys += ["label_key", "completion_key"]
    if not loss.needs_reference:
        keys.append("precompute_ref_log_probs")
    return [
        f"{key}={getattr(cfg, key)!r} has no effect with loss_type={loss.loss_type} "
        f"(it does not read {key})"
        for key in keys
        if getattr(cfg, key) != fields[key].default
    ]


def build_preference_data(cfg: Any) -> PreferenceData:
    d = cfg.actor_train.data_args
    return PreferenceData(
        train_files=data_files(d.file_name),
        eval_files=data_files(d.eval_file_name),
        prompt_key=d.prompt or "prompt",
        messages_key=d.messages,
        chosen_key=cfg.chosen_key,
        rejected_key=cfg.rejected_key,
        label_key=cfg.label_key,
        completion_key=cfg.completion_key,
        template=d.template,
        sequence_length=cfg.sequence_length,
        truncation_mode=cfg.truncation_mode,
    )


def compose_dpo(
    cfg: Any, *, device_kind: str = "cpu", flash_attn_available: bool = False
) -> DPOComponents:
    """The components of a preference run of `cfg` (a validated `ExperimentConfig`)."""
    from rl_runtime.compose import refuse_unsupported

    refuse_unsupported(getattr(cfg, "__wrapped__", cfg), "dpo")
    loss = build_preference_loss(cfg)
    warnings = unread_preference_keys(cfg, loss)
    from_actor = loss.needs_reference and reference_from_actor(cfg)
    names = ["actor_train"] + (["reference"] if loss.needs_reference and not from_actor else [])
    t = cfg.actor_train.training_args
    world = len(cfg.actor_train.device_mapping or [0])
    examples = t.per_device_train_batch_size * t.gradient_accumulation_steps * world
    rows_per_example = 2 if loss.paired else 1
    if cfg.actor_train.use_dynamic_batching_in_train and loss.paired:
        raise ValueError(
            "actor_train.use_dynamic_batching_in_train: token-budget micro-batches would split "
            f"the pairs of loss_type={loss.loss_type}; use per_device_train_batch_size"
        )
    roles = []
    for name in names:
        r = build_role(
            cfg,
            name,
            examples,
            device_kind,
            flash_attn_available,
            warnings,
            ppo_epochs=1,
            with_loss=False,
            logprob_sampling=LogprobSampling(),  # preference losses score the raw model
        )
        if name == "actor_train":
            assert r.training_args is not None and r.model_args is not None
            packed = r.model_args.attn_implementation in PACKED_KERNELS
            r = dataclasses.replace(
                r,
                loss=loss,
                training_args=dataclasses.replace(
                    r.training_args,
                    per_device_train_batch_size=t.per_device_train_batch_size * rows_per_example,
                    max_steps=cfg.max_steps,
                    shuffle_mini_batches=False,
                    use_sequence_packing=packed,
                ),
            )
        roles.append(r)
    if cfg.eval_steps and not cfg.actor_train.data_args.eval_file_name:
        warnings.append(
            "eval_steps > 0 without actor_train.data_args.eval_file_name: no held-out pairs"
        )
    reference = "none"
    if loss.needs_reference:
        reference = "cached" if cfg.precompute_ref_log_probs else "on_the_fly"
    return DPOComponents(
        exp_name=cfg.exp_name,
        seed=cfg.seed,
        output_dir=cfg.output_dir,
        pretrain=cfg.pretrain,
        roles=tuple(roles),
        preference=PreferencePlan(
            loss=loss,
            reference=reference,  # type: ignore[arg-type]
            examples_per_step=examples,
            rows_per_example=rows_per_example,
            data=build_preference_data(cfg),
        ),
        cadence=build_cadence(cfg),
        checkpoint=build_checkpoint(cfg),
        tracker=build_tracker(cfg, warnings),
        cluster=build_cluster(cfg, sync_bucket_bytes=0),
        sizes={
            "examples_per_step": examples,
            "rows_per_step": examples * rows_per_example,
            "optimizer_steps_total": cfg.max_steps,
        },
        warnings=tuple(warnings),
        reference_from_actor=from_actor,
    )
