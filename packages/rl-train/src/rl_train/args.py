"""Training arguments (ROLL's ``training_args`` names) read from a dict or a config object.

Units: ``per_device_train_batch_size`` is SAMPLES per micro-batch per rank; one optimizer step
(a mini-batch) consumes ``per_device_train_batch_size * gradient_accumulation_steps`` samples per
rank, i.e. that times ``world_size`` samples globally. ``ppo_epochs`` passes are made over each
batch given to ``train_step``. With dynamic batching, micro-batches are formed by a TOKEN budget
(``max_tokens_per_microbatch`` real tokens per rank) inside each mini-batch instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from rl_train.lora import LoraSettings, parse_lora

SchedulerName = Literal[
    "constant", "constant_with_warmup", "linear", "cosine", "cosine_with_min_lr"
]
_SCHEDULERS = ("constant", "constant_with_warmup", "linear", "cosine", "cosine_with_min_lr")


@dataclass(frozen=True)
class LogprobSampling:
    """The distribution whose log-probs (and entropy) the actor and reference forwards compute:
    the one the rollout samples from. ``softmax(logits / temperature)``, then the ``top_k`` /
    ``top_p`` kept set renormalised, in the samplers' order and tie rules
    (``rl_algos.logprobs.truncation_keep_mask``: top-k keeps ties with the k-th; top-p keeps the
    smallest stably-sorted prefix reaching ``top_p``, at least one token). The scored token always
    joins the kept set, so a token a stale policy sampled outside the current policy's set gets a
    finite log-prob (renormalised over the set plus that token), never ``-inf``.

    ``top_k`` None = off (else >= 1; >= V is off too); ``top_p`` None or 1 = off (else in (0, 1)).
    The default is the raw model (temperature 1, no truncation). The repetition penalty is not
    reproduced."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        key = "training_args.logprob_sampling"
        if isinstance(self.temperature, bool) or not float(self.temperature) > 0:
            raise ValueError(f"{key}.temperature must be > 0, got {self.temperature!r}")
        if self.top_k is not None and (
            isinstance(self.top_k, bool) or int(self.top_k) != self.top_k or self.top_k < 1
        ):
            raise ValueError(
                f"{key}.top_k must be None (off) or an integer >= 1, got {self.top_k!r}"
            )
        if self.top_p is not None and (
            isinstance(self.top_p, bool) or not 0.0 < float(self.top_p) <= 1.0
        ):
            raise ValueError(f"{key}.top_p must be None (off) or in (0, 1], got {self.top_p!r}")

    @property
    def truncates(self) -> bool:
        """Whether top-k or top-p is on (a top-k at or above the vocabulary still keeps all)."""
        return self.top_k is not None or (self.top_p is not None and self.top_p < 1.0)


def _logprob_sampling(value: Any) -> LogprobSampling:
    """``training_args.logprob_sampling`` from a :class:`LogprobSampling` or a mapping of its
    fields (unknown keys are an error naming them)."""
    if isinstance(value, LogprobSampling):
        return value
    if isinstance(value, Mapping):
        names = {f.name for f in fields(LogprobSampling)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(
                f"training_args.logprob_sampling: unknown keys {unknown} (known: {sorted(names)})"
            )
        return LogprobSampling(**value)
    raise ValueError(
        "training_args.logprob_sampling must be a LogprobSampling or a mapping of temperature, "
        f"top_k, top_p; got {type(value).__name__}"
    )


@dataclass
class TrainingArgs:
    learning_rate: float = 1e-6
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    lr_scheduler_type: str = "constant_with_warmup"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    max_steps: int = 1000
    """Total optimizer steps the scheduler plans for (cosine/linear decay horizon)."""
    min_lr_ratio: float = 0.0
    """Floor of the linear/cosine decay as a fraction of the peak rate (HF's ``min_lr_rate`` of
    ``cosine_with_min_lr``)."""
    max_grad_norm: float = 1.0
    per_device_train_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    ppo_epochs: int = 1
    shuffle_mini_batches: bool = False
    use_dynamic_batching: bool = False
    max_tokens_per_microbatch: int = 4096
    use_sequence_packing: bool = False
    share_prompt_forward: bool = False
    """Run each distinct prompt of a micro-batch once (its KV cache expanded to the rows that
    share it) in the actor/reference log-prob forward: :mod:`rl_train.shared_prefix`."""
    logprob_sampling: LogprobSampling = field(default_factory=LogprobSampling)
    """Log-probs and entropy of the actor and reference are those of the rollout's sampling
    distribution (temperature, top-k, top-p: :class:`LogprobSampling`), so the trained policy is
    the one that samples and the train-inference ratio compares like with like. The default is
    the raw model. A mapping of its fields is accepted."""
    sum_pi_squared: bool = False
    """The actor's no-grad :meth:`forward` also returns ``sum_pi_squared [B, T]``: ``sum_v pi(v)^2``
    of the same distribution as its log-probs (rl_algos.logprobs.sum_pi_squared_from_logits), for
    the optimal token baseline. It needs the logits (no fused log-prob head) and no top-k/top-p
    truncation."""
    max_consecutive_nonfinite: int = 3
    """Stop training with an error after this many optimizer steps in a row were skipped."""
    seed: int = 42
    infer_batch_size: int = 8
    """Samples per micro-batch in :meth:`forward` (no grad)."""

    def __post_init__(self) -> None:
        if self.lr_scheduler_type not in _SCHEDULERS:
            raise ValueError(
                f"training_args.lr_scheduler_type={self.lr_scheduler_type!r}; expected one of {_SCHEDULERS}"
            )
        for name in (
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "ppo_epochs",
            "max_tokens_per_microbatch",
            "max_consecutive_nonfinite",
            "infer_batch_size",
        ):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"training_args.{name} must be >= 1, got {getattr(self, name)!r}")
        self.logprob_sampling = _logprob_sampling(self.logprob_sampling)
        if self.max_steps < 1:
            raise ValueError(f"training_args.max_steps must be >= 1, got {self.max_steps}")

    @property
    def mini_batch_size(self) -> int:
        """Samples per optimizer step per rank."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps


_ALIASES = {
    "use_dynamic_batching_in_train": "use_dynamic_batching",
    "max_tokens_per_microbatch_in_train": "max_tokens_per_microbatch",
    "lr_scheduler": "lr_scheduler_type",
    "num_training_steps": "max_steps",
}


def as_mapping(obj: Any) -> dict[str, Any]:
    """A plain dict from a mapping, a pydantic model (``model_dump``), a dataclass or None."""
    if obj is None:
        return {}
    if isinstance(obj, Mapping):
        return dict(obj)
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dict(dump())  # type: ignore[arg-type]
    if hasattr(obj, "__dataclass_fields__"):
        return {f.name: getattr(obj, f.name) for f in fields(obj)}
    if hasattr(obj, "__dict__"):
        return {k: v for k, v in vars(obj).items() if not k.startswith("_")}
    raise TypeError(f"cannot read training arguments from {type(obj).__name__}")


def parse_training_args(obj: Any = None, **overrides: Any) -> TrainingArgs:
    """Build :class:`TrainingArgs`; unknown keys (other HF TrainingArguments) are ignored, known
    ones are type-checked. ``None`` values fall back to the defaults."""
    if isinstance(obj, TrainingArgs) and not overrides:
        return obj
    raw = as_mapping(obj)
    raw.update(overrides)
    if "logprob_temperature" in raw:
        raise ValueError(
            "training_args.logprob_temperature is now training_args.logprob_sampling.temperature "
            "(with top_k and top_p)"
        )
    known = {f.name: f for f in fields(TrainingArgs)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        key = _ALIASES.get(key, key)
        if key not in known or value is None:
            continue
        default = known[key].default
        try:
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise TypeError("expected a bool")
            elif isinstance(default, int):
                if isinstance(value, bool) or int(value) != value:
                    raise TypeError("expected an integer")
                value = int(value)
            elif isinstance(default, float):
                value = float(value)
        except (TypeError, ValueError) as err:
            raise ValueError(f"training_args.{key}={value!r}: {err}") from None
        values[key] = value
    return TrainingArgs(**values)


@dataclass
class ModelArgs:
    """``model_args``: dtype of the trained weights' compute, attention kernel, checkpointing."""

    dtype: str = "fp32"
    attn_implementation: str | None = "auto"
    """``auto`` (per device: PyTorch varlen flash attention on CUDA, sdpa elsewhere), ``varlen``,
    ``flash_attention_2``, ``sdpa`` or ``eager``; resolved by
    :func:`rl_train.attention.resolve_attn_implementation` when the model is loaded."""
    disable_gradient_checkpointing: bool = True
    freeze_module_prefix: tuple[str, ...] = ()
    """Parameter-name prefixes to freeze (ROLL ``model_args.freeze_module_prefix``, a
    comma-separated string or a list): those parameters get ``requires_grad=False`` and stay out
    of the optimizer; a prefix that matches no parameter is an error naming the key."""
    lora: LoraSettings | None = None
    """LoRA adapter of a trained role (:mod:`rl_train.lora`); None: every weight is trained."""
    config_overrides: dict[str, Any] = field(default_factory=dict)
    """HF model config attributes set before the weights load (``model_args.model_config_kwargs``,
    applied by :func:`rl_config.model_config.apply_model_config_overrides`: an unknown attribute
    is an error naming it)."""
    extra: dict[str, Any] = field(default_factory=dict)


_DTYPE_NAMES = {
    "fp32": "fp32",
    "float32": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
}


def parse_model_args(obj: Any = None) -> ModelArgs:
    raw = as_mapping(obj)
    dtype = str(raw.get("dtype") or "fp32").lower()
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"model_args.dtype={dtype!r}; expected one of fp32, bf16, fp16")
    attn = raw.get("attn_implementation") or "auto"
    disable_gc = raw.get("disable_gradient_checkpointing")
    return ModelArgs(
        dtype=_DTYPE_NAMES[dtype],
        attn_implementation=attn,
        disable_gradient_checkpointing=True if disable_gc is None else bool(disable_gc),
        freeze_module_prefix=parse_prefixes(raw.get("freeze_module_prefix")),
        lora=lora if isinstance(lora := raw.get("lora"), LoraSettings) else parse_lora(raw),
        # ModelArgs' field, or ROLL's key in a mapping
        config_overrides=dict(raw.get("config_overrides") or raw.get("model_config_kwargs") or {}),
        extra=raw,
    )


def parse_prefixes(value: Any) -> tuple[str, ...]:
    """``freeze_module_prefix`` as a tuple: ``"a,b"`` (ROLL's form), a list, or None."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    if not all(isinstance(p, str) for p in items):
        raise ValueError(f"model_args.freeze_module_prefix={value!r}: expected strings")
    prefixes = tuple(p.strip() for p in items if p.strip())
    if not prefixes and value:
        raise ValueError(f"model_args.freeze_module_prefix={value!r}: no prefix given")
    return prefixes
