"""Distillation teachers: each on workers of its own (role `teacher_<name>`, rl-train's
`reference` backend: log-probs only), which rows each teaches, and the check that its tokenizer
is the student's.

Config (the app's `teachers:` mapping, one entry per teacher; ROLL's `teacher:` section with
`tag_included` and `opd_kl_coef`):

    teachers:
      math: {model: PATH, tags: [math_dapo], kl_coef: 1.0, dtype: fp32,
             device_mapping: list(range(0,1)), infer_batch_size: 16}

A teacher teaches the rows whose tag is in its `tags`, or every row when it has none. A row
taught by several teachers learns from all of them, each with its `kl_coef` (ROLL's rule: the
advantage is `-sum_k kl_coef_k * reverse_kl_k`, rl_algos.distill.combine_teachers): disjoint
tags route each domain to its teacher; teachers without tags and `kl_coef: 1/K` average. A row
no teacher teaches is an error naming its tag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rl_runtime.compose.components import RolePlan

ROLE_PREFIX = "teacher_"
TEACHER_KEYS = ("model", "tags", "kl_coef", "dtype", "device_mapping", "infer_batch_size")
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class TeacherPlan:
    """One teacher: its model, the row tags it teaches (empty: every row), its KL coefficient
    (the advantage's scale on its rows), its workers."""

    name: str
    model_path: str
    tags: tuple[str, ...]
    kl_coef: float
    dtype: str
    device_mapping: tuple[int, ...]
    infer_batch_size: int

    @property
    def role(self) -> str:
        return f"{ROLE_PREFIX}{self.name}"


@dataclass(frozen=True)
class TeachersPlan:
    teachers: tuple[TeacherPlan, ...]

    def coefs(self, tags: list[str]) -> torch.Tensor:
        """`[K, B]`: teacher k's `kl_coef` on the rows it teaches, 0 elsewhere; ValueError
        naming a tag no teacher teaches."""
        taught = torch.tensor(
            [[not t.tags or tag in t.tags for tag in tags] for t in self.teachers],
            dtype=torch.bool,
        ).reshape(len(self.teachers), len(tags))
        lost = sorted({tag for tag, ok in zip(tags, taught.any(0).tolist(), strict=True) if not ok})
        if lost:
            raise ValueError(
                f"no teacher teaches rows tagged {lost}: the teachers' tags are "
                f"{ {t.name: list(t.tags) for t in self.teachers} } (a teacher with no tags "
                "teaches every row)"
            )
        coef = torch.tensor([t.kl_coef for t in self.teachers])[:, None]
        return taught.to(coef.dtype) * coef


def _teacher(name: str, raw: Any, default_devices: tuple[int, ...]) -> TeacherPlan:
    from rl_config.ranges import parse_device_list

    key = f"teachers.{name}"
    if not isinstance(raw, dict):
        raise ValueError(f"{key}: expected a mapping with keys {list(TEACHER_KEYS)}")
    unknown = sorted(set(raw) - set(TEACHER_KEYS))
    if unknown:
        raise ValueError(f"{key}: unknown key(s) {unknown}; known: {list(TEACHER_KEYS)}")
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError(f"{key}.model: the teacher's model directory (a string)")
    tags = raw.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ValueError(f"{key}.tags: a list of row tags, got {tags!r}")
    coef = raw.get("kl_coef", 1.0)
    if isinstance(coef, bool) or not isinstance(coef, int | float) or not 0 <= coef < float("inf"):
        raise ValueError(f"{key}.kl_coef: a finite number >= 0, got {coef!r}")
    dtype = raw.get("dtype", "fp32")
    if dtype not in DTYPES:
        raise ValueError(f"{key}.dtype={dtype!r}: one of {sorted(DTYPES)}")
    devices = default_devices
    if raw.get("device_mapping") is not None:
        try:
            devices = tuple(parse_device_list(raw["device_mapping"]))
        except ValueError as exc:
            raise ValueError(f"{key}.device_mapping: {exc}") from None
    batch = raw.get("infer_batch_size", 16)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"{key}.infer_batch_size: an integer >= 1, got {batch!r}")
    return TeacherPlan(name=name, model_path=model, tags=tuple(tags), kl_coef=float(coef),
                       dtype=DTYPES[dtype], device_mapping=devices,
                       infer_batch_size=batch)  # fmt: skip


def build_teachers(raw: Any, default_devices: tuple[int, ...]) -> TeachersPlan:
    """The teachers of the `teachers` mapping (ValueError naming the key at fault)."""
    if not isinstance(raw, dict) or not raw:
        raise ValueError("teachers: name at least one teacher ({name: {model: PATH, ...}})")
    return TeachersPlan(tuple(_teacher(str(n), r, default_devices) for n, r in raw.items()))


def teacher_role(t: TeacherPlan, cfg: Any) -> RolePlan:
    """The teacher's role: rl-train's `reference` backend (no optimizer) on the reference
    section's strategy, scoring the rollout's sampling distribution like the reference does."""
    from rl_runtime.compose.roles import rollout_sampling_distribution
    from rl_train.args import ModelArgs, TrainingArgs

    sa = cfg.reference.strategy_args
    return RolePlan(
        role=t.role, device_mapping=t.device_mapping, devices_per_worker=1,
        strategy_name=sa.strategy_name, strategy_config=dict(sa.strategy_config or {}),
        model_path=t.model_path, dtype=t.dtype, backend="reference",
        model_config_key=f"distill_app.teachers.{t.name}.model",
        model_args=ModelArgs(lora=None, dtype={v: k for k, v in DTYPES.items()}[t.dtype],
                             attn_implementation="sdpa", disable_gradient_checkpointing=True),
        training_args=TrainingArgs(seed=cfg.seed, infer_batch_size=t.infer_batch_size,
                                   logprob_sampling=rollout_sampling_distribution(cfg)),
    )  # fmt: skip


def tokenizer_identity(tokenizer: Any) -> tuple:
    """What must agree between two tokenizers for one's token ids to mean the same text in the
    other: the vocabulary (token -> id, added tokens included) and the eos / pad ids."""
    return (
        tuple(sorted(tokenizer.get_vocab().items())),
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )


def check_tokenizers(student: str, teachers: tuple[TeacherPlan, ...]) -> None:
    """ValueError naming the student's and the teacher's model when a teacher's tokenizer
    differs from the student's (vocabulary, eos or pad id)."""
    from transformers import AutoTokenizer

    want = tokenizer_identity(AutoTokenizer.from_pretrained(student))
    for t in teachers:
        got = tokenizer_identity(AutoTokenizer.from_pretrained(t.model_path))
        if got != want:
            why = (
                f"{len(got[0])} vs {len(want[0])} tokens"
                if len(got[0]) != len(want[0])
                else "the same size but different tokens, ids or eos/pad"
            )
            raise ValueError(
                f"teachers.{t.name}: the teacher's tokenizer ({t.model_path}) differs from the "
                f"student's ({student}): {why}; on-policy distillation scores the student's "
                "token ids with the teacher, so both must use one tokenizer"
            )
