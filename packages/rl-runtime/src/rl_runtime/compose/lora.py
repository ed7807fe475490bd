"""LoRA in composition: a trained role's adapter from ROLL's `model_args.lora_*` keys, whether
weight syncs carry the adapter only, vLLM's LoRA options, and whether the reference is the
actor's base model (no reference worker then)."""

from __future__ import annotations

from typing import Any

from rl_runtime.compose.components import Components
from rl_train.lora import LoraSettings


def build_lora(m: Any, role: str) -> LoraSettings | None:
    """A trained role's LoRA adapter from ROLL's `model_args.lora_*` keys and
    `adapter_name_or_path` (rl_train.lora.parse_lora); None: every weight trains. A bad value
    is an error naming `<role>.model_args.<key>`."""
    from rl_train.lora import parse_lora

    keys = ("lora_target", "lora_rank", "lora_alpha", "lora_dropout", "adapter_name_or_path")
    raw = {k: getattr(m, k) for k in keys}
    try:
        return parse_lora(raw)
    except ValueError as err:
        raise ValueError(str(err).replace("model_args.", f"{role}.model_args.")) from None


def sync_adapter_only(components: Components) -> bool:
    """Whether weight syncs carry actor_train's LoRA adapter only (rl_sync.adapter): it trains
    one and the engine takes adapters (`rl_rollout.registry.engine_takes_adapters`: the HF
    engine merges them, vLLM with `enable_lora` loads them by request); otherwise the engines
    get the merged weights."""
    from rl_rollout.registry import engine_takes_adapters

    actor, infer = components.role("actor_train"), components.role("actor_infer")
    lora = actor is not None and actor.model_args is not None and actor.model_args.lora is not None
    return (
        lora
        and infer is not None
        and engine_takes_adapters(infer.strategy_name, infer.strategy_config)
    )


def engine_lora_options(cfg: Any, strategy_config: dict[str, Any], warnings: list[str]) -> None:
    """vLLM's LoRA options for a LoRA-trained actor, in place: with `enable_lora` an unset
    `max_lora_rank` becomes the smallest vLLM takes for actor_train's `lora_rank` (an adapter
    from `adapter_name_or_path` brings its own rank: vLLM's default applies, and the engine
    names the key if it is too small); without it a warning says vLLM gets merged weights."""
    from rl_rollout.vllm_lora import vllm_max_lora_rank

    actor = getattr(cfg, "actor_train", None)
    lora = None if actor is None else build_lora(actor.model_args, "actor_train")
    key = "actor_infer.strategy_args.strategy_config"
    if not strategy_config.get("enable_lora"):
        if lora is not None:
            warnings.append(
                f"{key}.enable_lora is off: each weight sync sends vLLM the merged model (full "
                "size); enable_lora: true loads actor_train's LoRA adapter by request instead"
            )
        return
    if lora is None:
        warnings.append(
            f"{key}.enable_lora: actor_train trains no LoRA adapter, so vLLM gets full weights "
            "and its LoRA support is unused"
        )
    elif "max_lora_rank" not in strategy_config and lora.adapter_path is None:
        strategy_config["max_lora_rank"] = vllm_max_lora_rank(lora.rank)


def reference_from_actor(cfg: Any) -> bool:
    """Whether the reference log-probs come from actor_train with its LoRA adapter disabled:
    actor_train trains LoRA and the reference model is its base model (the same
    `model_name_or_path`, unset meaning `pretrain`). Then no reference worker starts, which
    saves a whole copy of the model's weights (2 bytes a parameter in bf16)."""
    if build_lora(cfg.actor_train.model_args, "actor_train") is None:
        return False
    actor = cfg.actor_train.model_args.model_name_or_path or cfg.pretrain
    return (cfg.reference.model_args.model_name_or_path or cfg.pretrain) == actor
