"""A role's model config override (``<role>.model_args.model_config_kwargs``), applied where the
model is built: the trainers (rl_train.modeling.load_model), the rollout engines (the HF
engine's config; vLLM's ``hf_overrides``) and the exported model's ``config.json``.

``apply_model_config_overrides(config, overrides, key)`` is the one function that applies it: it
sets each ``name: value`` on a Hugging Face config object (``transformers.PretrainedConfig``;
duck-typed, so this package needs no transformers) after checking every name first. A name the
config does not have is a ``ValueError`` naming ``<key>.<name>`` and the model type, nothing
set: a misspelt override would otherwise be stored on the config and read by nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KEY = "model_args.model_config_kwargs"


def check_model_config_overrides(config: Any, overrides: Mapping[str, Any], key: str = KEY) -> None:
    """Raise ``ValueError`` naming ``<key>.<name>`` for each override ``config`` has no attribute
    for (or whose name is not a string)."""
    unknown = sorted(str(n) for n in overrides if not isinstance(n, str) or not hasattr(config, n))
    if unknown:
        kind = getattr(config, "model_type", type(config).__name__)
        raise ValueError(
            "; ".join(f"{key}.{n}" for n in unknown)
            + f": not an attribute of the model's config ({kind}); nothing is overridden"
        )


def apply_model_config_overrides(config: Any, overrides: Mapping[str, Any], key: str = KEY) -> Any:
    """Set ``overrides`` (``{attribute: value}``) on the HF ``config`` after checking every name
    (`check_model_config_overrides`); returns ``config``."""
    check_model_config_overrides(config, overrides, key)
    for name, value in overrides.items():
        setattr(config, name, value)
    return config
