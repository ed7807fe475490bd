"""``rl-config convert``: a Megatron config rewritten for FSDP2 or DeepSpeed (ZeRO-3).

What changes, per role that uses a Megatron strategy:

* ``strategy_args`` becomes ``fsdp2_train`` (bf16 params, fp32 reductions) or ``deepspeed_train``
  with the bundled ZeRO-3 config inlined; a forward-only ``megatron_infer`` role becomes the
  same training strategy (reference) or ``hf_infer`` (generation);
* the model-parallel sizes (tensor, pipeline, context, expert) fold into data parallelism: every
  device of ``device_mapping`` becomes one data-parallel rank, and training roles divide
  ``gradient_accumulation_steps`` by tensor × pipeline × context so one optimizer step still
  consumes the same number of samples;
* every other Megatron option is dropped, with one note per key.

A config of ROLL's on-policy distillation is rewritten for apps/distill (rl_config.convert_opd),
one of its offline (token-level) distillation too (rl_config.convert_ofd).
``actor_infer`` on SGLang becomes vLLM (``mem_fraction_static`` -> ``gpu_memory_utilization``).
The rest of the file is kept as written, ``${...}`` interpolations included (secrets read with
``${oc.env:...}`` stay references); the defaults list is merged in, so the output stands alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rl_config.convert_ofd import convert_offline_distill, is_offline_distill
from rl_config.convert_opd import APP_SECTION, convert_opd, is_opd
from rl_config.errors import ConfigError, ConfigIssue
from rl_config.ranges import parse_device_list
from rl_config.roll_compat import MEGATRON_ONLY, MEGATRON_PARALLEL_SIZES
from rl_config.roll_keys import lookup, megatron_roles

Target = Literal["fsdp2", "deepspeed"]
TRAIN_STRATEGY: dict[str, str] = {"fsdp2": "fsdp2_train", "deepspeed": "deepspeed_train"}
FSDP2_STRATEGY_CONFIG: dict[str, Any] = {
    "param_dtype": "bf16",
    "reduce_dtype": "fp32",
    "reshard_after_forward": True,
}
"""strategy_config written for fsdp2_train."""
_MODEL_PARALLEL = ("tensor_model_parallel_size", "pipeline_model_parallel_size")
_DP_SHRINKING = (*_MODEL_PARALLEL, "context_parallel_size")
"""Megatron sizes that divide the data-parallel size (expert parallelism does not)."""


@dataclass
class Conversion:
    """The converted mapping (unresolved, ready to dump) and one note per change."""

    data: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def _deepspeed_zero3() -> dict[str, Any]:
    import yaml

    from rl_config.loading import LIBRARY_DIR

    text = (LIBRARY_DIR / "config" / "deepspeed_zero3.yaml").read_text()
    return dict(yaml.safe_load(text)["deepspeed_zero3"])


def _int(value: Any, path: str) -> int:
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(ConfigIssue(path, f"expected a positive integer, got {value!r}"))
    return value


def _convert_role(
    role: str,
    section: dict[str, Any],
    resolved: dict[str, Any],
    target: Target,
    notes: list[str],
) -> None:
    """Rewrite one Megatron role in place (``resolved`` is its interpolated twin)."""
    strategy = resolved["strategy_args"]
    name = strategy["strategy_name"]
    options = strategy.get("strategy_config") or {}
    prefix = f"{role}.strategy_args.strategy_config"
    sizes = {k: _int(options.get(k), f"{prefix}.{k}") for k in MEGATRON_PARALLEL_SIZES}
    for key in options:
        why = lookup(MEGATRON_ONLY, f"{role}.strategy_args.strategy_config.{key}") or "Megatron"
        if key in _DP_SHRINKING:
            why = f"{why}; folded into data parallelism"
        elif key == "expert_model_parallel_size":
            why = f"{why}; every rank holds all experts"
        notes.append(f"dropped {prefix}.{key}={options[key]!r} ({why})")
    shrink = math.prod(sizes[k] for k in _DP_SHRINKING)
    if role == "actor_infer" and name == "megatron_infer":
        section["strategy_args"] = {"strategy_name": "hf_infer", "strategy_config": {}}
    elif target == "fsdp2":
        section["strategy_args"] = {
            "strategy_name": "fsdp2_train",
            "strategy_config": FSDP2_STRATEGY_CONFIG,
        }
    else:
        section["strategy_args"] = {
            "strategy_name": "deepspeed_train",
            "strategy_config": _deepspeed_zero3(),
        }
    new = section["strategy_args"]["strategy_name"]
    notes.append(f"{role}.strategy_args.strategy_name: {name} -> {new}")
    mapping = resolved.get("device_mapping")
    if mapping is not None:
        devices = len(parse_device_list(mapping))
        notes.append(
            f"{role}: {devices} devices = {devices} data-parallel ranks (Megatron: tensor "
            f"{sizes['tensor_model_parallel_size']} × pipeline "
            f"{sizes['pipeline_model_parallel_size']} × context {sizes['context_parallel_size']})"
        )
    training = resolved.get("training_args") or {}
    warmup = training.get("warmup_steps") or training.get("warmup_ratio")
    if name == "megatron_train" and training.get("lr_scheduler_type") == "constant" and warmup:
        section.setdefault("training_args", {})["lr_scheduler_type"] = "constant_with_warmup"
        notes.append(
            f"{role}.training_args.lr_scheduler_type: constant -> constant_with_warmup (Megatron "
            "warms up under every decay style; constant here has no warmup)"
        )
    accumulation = training.get("gradient_accumulation_steps")
    if shrink > 1 and isinstance(accumulation, int) and name == "megatron_train":
        key = f"{role}.training_args.gradient_accumulation_steps"
        if accumulation % shrink == 0:
            section.setdefault("training_args", {})["gradient_accumulation_steps"] = (
                accumulation // shrink
            )
            notes.append(
                f"{key}: {accumulation} -> {accumulation // shrink} (data parallelism grew "
                f"{shrink}×; samples per optimizer step unchanged)"
            )
        else:
            notes.append(
                f"{key}: kept {accumulation}, not divisible by {shrink}: an optimizer step now "
                f"consumes {shrink}× more samples; adjust it by hand"
            )


def _convert_sglang(section: dict[str, Any], resolved: dict[str, Any], notes: list[str]) -> None:
    options = dict(resolved["strategy_args"].get("strategy_config") or {})
    new: dict[str, Any] = {}
    if "mem_fraction_static" in options:
        new["gpu_memory_utilization"] = options.pop("mem_fraction_static")
    if "load_format" in options:
        new["load_format"] = options.pop("load_format")
    for key, value in options.items():
        notes.append(f"dropped actor_infer.strategy_args.strategy_config.{key}={value!r} (SGLang)")
    section["strategy_args"] = {"strategy_name": "vllm", "strategy_config": new}
    notes.append("actor_infer.strategy_args.strategy_name: sglang -> vllm")


def convert_data(
    unresolved: dict[str, Any], resolved: dict[str, Any], target: Target
) -> Conversion:
    """Convert a composed config (``unresolved`` keeps ``${...}``; ``resolved`` is interpolated)."""
    if target not in TRAIN_STRATEGY:
        raise ConfigError(
            ConfigIssue("", f"unknown target strategy {target!r}; use fsdp2 or deepspeed")
        )
    data = {k: v for k, v in unresolved.items() if k not in ("defaults", "hydra")}
    notes: list[str] = []
    roles = megatron_roles(resolved)
    offline = is_offline_distill(resolved)
    if not roles and not is_opd(resolved) and not offline:
        notes.append("no role uses a Megatron strategy; nothing to convert")
    for role in roles:
        _convert_role(role, data[role], resolved[role], target, notes)
    if is_opd(resolved):  # named teachers are roles one level down; then apps/distill's form
        named = resolved["teacher"] if "teacher" not in roles else {}
        for name in megatron_roles(named) if isinstance(named, dict) else ():
            _convert_role(f"teacher.{name}", data["teacher"][name], named[name], target, notes)
        convert_opd(data, resolved, notes)
    elif offline:
        convert_offline_distill(data, resolved, notes)
    infer = resolved.get("actor_infer")
    if isinstance(infer, dict):
        name = (infer.get("strategy_args") or {}).get("strategy_name")
        if name == "sglang":
            _convert_sglang(data["actor_infer"], infer, notes)
    return Conversion(data, notes)


def convert_file(path: str | Path, target: Target) -> Conversion:
    """Compose ``path`` (defaults merged, interpolations kept) and convert it."""
    from rl_config.loading import _referenced_roots, _schema_keys, compose_config
    from rl_config.roll_compat import ROLL_IGNORED, ROLL_NOT_SUPPORTED, SFT_ROLE

    file = Path(path).expanduser().resolve()
    composed = compose_config(file, keep_variables=True)  # composed once: data and unresolved
    conversion = convert_data(composed.unresolved, composed.data, target)
    # variables stay only when a kept key refers to them (directly or through other variables)
    data = conversion.data
    known = _schema_keys() | set(ROLL_IGNORED) | set(ROLL_NOT_SUPPORTED) | {APP_SECTION, SFT_ROLE}
    keep = {k for k in data if k in known}
    while True:
        more = _referenced_roots({k: data[k] for k in keep}) & set(data) - keep
        if not more:
            break
        keep |= more
    conversion.data = {k: v for k, v in data.items() if k in keep}
    return conversion


def dump(conversion: Conversion, source: str, target: Target) -> str:
    """YAML text of a conversion, headed by its notes as comments."""
    import yaml

    head = [f"# Converted from {source} by `rl-config convert --strategy {target}`."]
    head += [f"# - {note}" for note in conversion.notes]
    body = yaml.safe_dump(conversion.data, sort_keys=False, allow_unicode=True, width=100)
    return "\n".join(head) + "\n" + body
