"""An adapter-only weight update (:mod:`rl_sync.adapter`) as the peft adapter directory vLLM
loads by request (``LoRARequest``), for :class:`rl_rollout.vllm_engine.VLLMEngine` started with
``strategy_config.enable_lora: true``.

The payload carries, per adapted module ``<module>`` (HF names), ``<module>.lora_A.weight``
``[r, in]`` and ``<module>.lora_B.weight`` ``[out, r]`` with the scale ``alpha / r`` already in B.
The directory written here is a plain peft LoRA adapter of that: the same tensors under peft's
names (``base_model.model.<module>.lora_A.weight``) and ``lora_alpha = r`` (scale 1), so vLLM (or
``peft.PeftModel.from_pretrained``) computes ``W0 x + B (A x)``: the trainer's model. Pure
functions of the tensors; nothing here imports vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch

from rl_sync.adapter import adapter_part

#: the vLLM LoRA ranks ``max_lora_rank`` may take (vLLM's ``MaxLoRARanks``, 0.11 to 0.32)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}")


def vllm_takes_adapters(strategy_config: dict) -> bool:
    """vLLM loads adapter-only updates by request when started with ``enable_lora``."""
    return bool(strategy_config.get("enable_lora"))


def is_adapter_payload(names: Iterable[str], *, lora_enabled: bool) -> bool:
    """Whether a weight update's tensor ``names`` are an adapter-only payload (every name a
    factor) rather than full weights (no name a factor). A mix, or an adapter payload for an
    engine started without LoRA, is an error naming what to change."""
    names = list(names)
    factors = [n for n in names if adapter_part(n) is not None]
    if not factors:
        return False
    if len(factors) != len(names):
        other = next(n for n in names if adapter_part(n) is None)
        raise ValueError(
            f"update_weights: adapter factors ({factors[0]!r}) mixed with full weights "
            f"({other!r}); a weight update is either an adapter payload or full weights"
        )
    if not lora_enabled:
        raise ValueError(
            "VLLMEngine: an adapter-only weight update needs vLLM's LoRA support "
            "(actor_infer.strategy_args.strategy_config.enable_lora: true, which loads the "
            "adapter by request); without it sync merged weights"
        )
    return True


def write_adapter_dir(
    tensors: dict[str, torch.Tensor], out_dir: Path, base_model: str, max_rank: int
) -> Path:
    """Write the adapter payload ``tensors`` as a peft adapter directory ``out_dir`` (created;
    ``adapter_config.json``, ``adapter_model.safetensors``); returns it. Every module needs both
    factors of one rank r <= ``max_rank`` (the engine's ``max_lora_rank``)."""
    from safetensors.torch import save_file

    modules: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        part = adapter_part(name)
        if part is None:
            raise ValueError(f"update_weights: {name!r} is not an adapter factor")
        modules.setdefault(part[0], {})[part[1]] = tensor
    ranks = set()
    for module, pair in modules.items():
        if set(pair) != {"A", "B"}:
            raise ValueError(
                f"update_weights: adapter of {module!r} lacks a factor: {sorted(pair)}"
            )
        a, b = pair["A"], pair["B"]
        if a.dim() != 2 or b.dim() != 2 or b.shape[1] != a.shape[0]:
            raise ValueError(
                f"update_weights: adapter factors of {module!r} A {tuple(a.shape)} and B "
                f"{tuple(b.shape)} are not A [r, in], B [out, r]"
            )
        ranks.add(int(a.shape[0]))
    if len(ranks) != 1:
        raise ValueError(f"update_weights: the adapter's modules have different ranks {ranks}")
    (rank,) = ranks
    if rank > max_rank:
        raise ValueError(
            f"update_weights: adapter rank {rank} exceeds the engine's max_lora_rank {max_rank} "
            f"(set actor_infer.strategy_args.strategy_config.max_lora_rank: "
            f"{vllm_max_lora_rank(rank)})"
        )
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": rank,  # B carries alpha / r: scale 1
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "target_modules": sorted({m.rsplit(".", 1)[-1] for m in modules}),
    }
    out_dir.mkdir(parents=True)
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2))
    peft_named = {
        f"base_model.model.{module}.lora_{p}.weight": t.detach().to("cpu").contiguous()
        for module, pair in modules.items()
        for p, t in pair.items()
    }
    save_file(peft_named, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    return out_dir
