"""What the apps' own option sections (`agentic_app:`, `rlvr_app:`, `dpo_app:`) share: a strict
builder from the YAML mapping, the locally built tiny model's shape, and the runtime options every
app has (`AppRunOptions`, which an app's options class extends)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, is_dataclass
from types import UnionType
from typing import Any, ClassVar, TypeVar, get_args, get_type_hints

T = TypeVar("T")


@dataclass
class TinyModelOptions:
    """The shape of `rl_rollout.tiny_model.build_tiny_model` when an app builds one."""

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    intermediate_size: int = 256
    seed: int = 0
    #: the standard deviation of the random initial weights (build_tiny_model's default 0.1;
    #: Qwen's own is 0.02)
    initializer_range: float = 0.1

    def __post_init__(self) -> None:
        from rl_rollout.tiny_model import check_tiny_model_shape

        if not (math.isfinite(self.initializer_range) and self.initializer_range > 0):
            raise ValueError(f"initializer_range={self.initializer_range}: must be > 0")

        check_tiny_model_shape(
            hidden_size=self.hidden_size, num_layers=self.num_layers, num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, intermediate_size=self.intermediate_size,
        )  # fmt: skip


def strict_options(cls: type[T], raw: dict[str, Any] | None, path: str) -> T:
    """The dataclass `cls` from the mapping `raw`; an unknown key, or a value that is not of its
    field's type (`bool`, `int`, `float`, `str`, each optionally `| None`), is an error naming
    `path.key`. A field whose default is a dataclass (`field(default_factory=Sub)`) is built
    from its sub-mapping the same way, as `path.field`."""
    raw = dict(raw or {})
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; known: {sorted(known)}")
    hints = get_type_hints(cls)
    for name, value in raw.items():
        sub = known[name].default_factory
        if isinstance(sub, type) and is_dataclass(sub) and not is_dataclass(value):
            raw[name] = strict_options(sub, value, f"{path}.{name}")
        else:
            _check_type(value, hints[name], f"{path}.{name}")
    try:
        return cls(**raw)
    except ValueError as exc:  # a dataclass's own check (`__post_init__`) that names no key
        if str(exc).startswith(path):
            raise
        raise ValueError(f"{path}: {exc}") from None


_SCALARS = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}


def _check_type(value: Any, hint: Any, where: str) -> None:
    """Raise ValueError naming `where` unless `value` is of the scalar type `hint` (a bool is no
    int; an int is a float); other hints are not checked."""
    allowed = get_args(hint) if isinstance(hint, UnionType) else (hint,)
    if value is None and type(None) in allowed:
        return
    scalars = [t for t in allowed if t in _SCALARS]
    if not scalars or len(scalars) + (type(None) in allowed) < len(allowed):
        return
    for t in scalars:
        if t is float and isinstance(value, int | float) and not isinstance(value, bool):
            if math.isfinite(value):
                return
        elif isinstance(value, t) and not (t is int and isinstance(value, bool)):
            return
    expected = " or ".join(_SCALARS[t] for t in scalars) + (
        " or null" if type(None) in allowed else ""
    )
    raise ValueError(f"{where}: expected {expected}, got {value!r} ({type(value).__name__})")


@dataclass
class AppRunOptions:
    """The options of every app section: the model it builds, where and how its workers run.
    An app's options extend this class, name their YAML section in `SECTION` and the pipeline
    kind they run in `PIPELINE` (agentic, rlvr, dpo: what a resume checks, rl_runtime.run.resume_guard)."""

    SECTION: ClassVar[str] = "app"
    PIPELINE: ClassVar[str | None] = None
    #: the directory to build a tiny model in (the CPU defaults: ./output/tiny_model); built
    #: only when `pretrain` names that same directory (rl_runtime.run.model_source), never elsewhere
    build_tiny_model: str | None = None
    tiny_model: TinyModelOptions = field(default_factory=TinyModelOptions)
    #: workers as Ray actors (False: every worker in this process, like `--no-ray`)
    use_ray: bool = True
    num_cpus: float | None = None
    object_store_mb: int = 200
    cpu_per_bundle: float = 1.0
    #: write the trained policy as an HF model directory at the end
    export_hf: bool = False
    eval_before_training: bool = True

    @classmethod
    def from_mapping(cls, raw: dict[str, Any] | None) -> Any:
        raw = dict(raw or {})
        if raw.get("build_tiny_model") is False:  # off, as `null`
            raw["build_tiny_model"] = None
        if raw.get("build_tiny_model") is True:
            raise ValueError(
                f"{cls.SECTION}.build_tiny_model: expected the directory to build a tiny model "
                "in (the same path as pretrain, which then loads it), or null; `true` would "
                "build a random model at whatever pretrain names"
            )
        return strict_options(cls, raw, cls.SECTION)

    def built_models(self) -> tuple[str, ...]:
        """Model directories the app builds before the run (besides `build_tiny_model`): a
        preflight takes them as present (the CPU defaults' teachers)."""
        return ()

    def model_path(self, pretrain: str, system_envs: dict[str, Any] | None = None) -> str:
        """The policy model's local directory: the tiny model built (or reused) at `pretrain`
        when `build_tiny_model` names that directory, else `pretrain` resolved
        (rl_runtime.run.model_source.policy_model: a missing model is a ConfigError)."""
        from rl_runtime.run.model_source import policy_model

        return policy_model(
            pretrain, build_at=self.build_tiny_model, tiny_model=self.tiny_model,
            key=f"{self.SECTION}.build_tiny_model", system_envs=system_envs,
        )  # fmt: skip
