"""Which schema keys code reads: a proxy over a pydantic config that records every dotted key
read through it and the module whose code read it. The key contract's tests and the generated
configuration reference (docs/config.md) compose configs through it.

    reads: dict[str, set[str]] = defaultdict(set)
    compose(KeyReads(ExperimentConfig.model_validate(data), reads))
    reads["actor_train.training_args.learning_rate"]  # {"rl_runtime.compose.roles"}
"""

from __future__ import annotations

import sys
from typing import Any

from pydantic import BaseModel


class KeyReads:
    """Proxy of a pydantic config (`obj`, at dotted prefix `path`): each schema field read is
    recorded in `reads` as key -> reading modules; nested models and dicts of models are proxied
    too (a dict's entries as `<key>.*.`), other attributes pass through unrecorded."""

    def __init__(self, obj: BaseModel, reads: dict[str, set[str]], path: str = "") -> None:
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_reads", reads)

    @property
    def __wrapped__(self) -> BaseModel:
        return self._obj

    def __getattr__(self, name: str) -> Any:
        obj, path, reads = self._obj, self._path, self._reads
        value = getattr(obj, name)
        info = type(obj).model_fields.get(name)
        if info is None:
            return value
        key = f"{path}{info.alias or name}"
        if isinstance(value, BaseModel):
            return KeyReads(value, reads, key + ".")
        if (
            isinstance(value, dict)
            and value
            and all(isinstance(v, BaseModel) for v in value.values())
        ):
            return {k: KeyReads(v, reads, key + ".*.") for k, v in value.items()}
        reads.setdefault(key, set()).add(sys._getframe(1).f_globals.get("__name__", "?"))
        return value
