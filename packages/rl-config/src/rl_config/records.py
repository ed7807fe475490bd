"""Records that flow between components (msgspec Structs).

These are the wire format of the stack: generation requests and results between the agent loop and
an engine, and trajectories from rollout to the trainer. They are plain data (lists, not tensors) so
any process can decode them without torch; the runtime collates them into ``[B, T]`` tensors.

Token alignment: ``Trajectory.token_ids`` is the whole conversation (prompt, model turns, env
turns). ``response_mask[t]`` is True iff token ``t`` was sampled by the model and is trained on.
``rollout_log_probs[t]`` is the engine's log-prob of token ``t`` under the distribution it was
sampled from (temperature, and top-k / top-p where set: rl_rollout's engine contract), and ``0.0``
wherever ``response_mask`` is False.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any, Literal, TypeVar

import msgspec

FinishReason = Literal["stop", "length", "abort"]
TerminationReason = Literal[
    "success",  # the env reported success and terminated
    "terminated",  # the env terminated without success (e.g. fell into a hole)
    "max_steps",  # the env's step budget ran out (truncated)
    "max_length",  # the sequence budget (sequence_length / max_tokens) ran out
    "aborted",  # the engine aborted the request (partial rollout)
    "error",  # the env or engine raised or timed out; the trajectory is marked failed
]

T = TypeVar("T")


class SamplingParams(msgspec.Struct, kw_only=True, frozen=True):
    """How to sample one request. ``top_k=-1`` and ``top_p=1.0`` disable truncation.

    ``temperature=0`` means greedy. ``seed`` makes sampling reproducible per request.
    ``repetition_penalty`` (1.0 = off) divides positive / multiplies negative logits of tokens
    already in the prompt or output (CTRL, as HF and vLLM do); log-probs stay raw.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    repetition_penalty: float = 1.0
    stop: list[str] = []
    stop_token_ids: list[int] = []
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(
                f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}"
            )
        if self.repetition_penalty <= 0:
            raise ValueError(
                f"SamplingParams.repetition_penalty must be > 0, got {self.repetition_penalty}"
            )


class GenerationRequest(msgspec.Struct, kw_only=True, frozen=True):
    """One prompt to complete. ``prompt_ids`` are token ids; engines never re-tokenise."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams = SamplingParams()

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"GenerationRequest {self.request_id!r}: prompt_ids is empty")


class GenerationResult(msgspec.Struct, kw_only=True):
    """One sampled completion. With ``n > 1`` an engine returns ``n`` results per request,
    same ``request_id``, ``sample_index`` 0..n-1, in request order.

    ``output_log_probs[i]`` is log p(output_ids[i] | prompt, output_ids[:i]) under the distribution
    the token was sampled from (temperature, top-k / top-p; greedy: temperature 1). With top-k and
    top-p off, what a teacher-forced trainer forward at the sampling temperature computes.
    ``token_versions[i]`` is the weight version that sampled ``output_ids[i]`` (partial rollout
    continues a generation under newer weights); empty means all are ``weight_version``.
    """

    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    output_log_probs: list[float]
    finish_reason: FinishReason
    weight_version: int
    sample_index: int = 0
    stop_reason: str | int | None = None
    token_versions: list[int] = []

    def __post_init__(self) -> None:
        if len(self.output_ids) != len(self.output_log_probs):
            raise ValueError(
                f"GenerationResult {self.request_id!r}: {len(self.output_ids)} output_ids but "
                f"{len(self.output_log_probs)} output_log_probs"
            )
        _check_token_versions(
            f"GenerationResult {self.request_id!r}", self.token_versions, len(self.output_ids)
        )


class Turn(msgspec.Struct, kw_only=True):
    """One model action and the env's answer. ``[start, end)`` indexes the model tokens of this
    turn in the trajectory's ``token_ids``; ``reward`` is the env reward of this step."""

    turn_idx: int
    start: int
    end: int
    action_text: str = ""
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    format_ok: bool = True
    info: dict[str, Any] = {}


class Trajectory(msgspec.Struct, kw_only=True):
    """A whole episode as the model saw and produced it, token-exact.

    ``prompt_length`` is the length of the first prompt; everything after it is the "response"
    (model and env turns). ``group_id`` is the GRPO group (ROLL's ``traj_group_id``): trajectories
    sharing it started from the same env config and seed.
    ``token_versions[t]`` is the weight version that sampled token ``t`` (meaningful where
    ``response_mask`` is True); empty means every model token has ``weight_version``.
    ``baseline_reward`` is the reward of a greedy response to the same prompt (ReMax's baseline),
    None where the pipeline ran no baseline rollout.
    """

    traj_id: str
    group_id: str
    tag: str
    env_seed: int
    token_ids: list[int]
    prompt_length: int
    response_mask: list[bool]
    rollout_log_probs: list[float]
    turns: list[Turn] = []
    episode_reward: float = 0.0
    success: bool = False
    termination_reason: TerminationReason = "terminated"
    weight_version: int = 0
    failed: bool = False
    error: str | None = None
    timing: dict[str, float] = {}
    metrics: dict[str, float] = {}
    token_versions: list[int] = []
    baseline_reward: float | None = None

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        _check_token_versions(f"Trajectory {self.traj_id!r}", self.token_versions, n)
        if len(self.response_mask) != n or len(self.rollout_log_probs) != n:
            raise ValueError(
                f"Trajectory {self.traj_id!r}: token_ids ({n}), response_mask "
                f"({len(self.response_mask)}) and rollout_log_probs "
                f"({len(self.rollout_log_probs)}) must have equal lengths"
            )
        if not 0 <= self.prompt_length <= n:
            raise ValueError(
                f"Trajectory {self.traj_id!r}: prompt_length {self.prompt_length} outside [0, {n}]"
            )
        if any(self.response_mask[: self.prompt_length]):
            raise ValueError(
                f"Trajectory {self.traj_id!r}: response_mask is True inside the prompt"
            )
        for turn in self.turns:
            if not self.prompt_length <= turn.start <= turn.end <= n:
                raise ValueError(
                    f"Trajectory {self.traj_id!r}: turn {turn.turn_idx} span "
                    f"[{turn.start}, {turn.end}) outside the response [{self.prompt_length}, {n})"
                )
        for name in ("episode_reward", "baseline_reward"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"Trajectory {self.traj_id!r}: {name} is {value}")

    @property
    def num_response_tokens(self) -> int:
        """Number of model-generated (trained) tokens."""
        return sum(self.response_mask)


def _check_token_versions(owner: str, versions: list[int], num_tokens: int) -> None:
    if versions and len(versions) != num_tokens:
        raise ValueError(
            f"{owner}: token_versions has {len(versions)} entries for {num_tokens} tokens "
            "(empty means every token has weight_version)"
        )
    if any(v < 0 for v in versions):
        raise ValueError(f"{owner}: token_versions holds a negative version")


def oldest_weight_version(record: GenerationResult | Trajectory) -> int:
    """The oldest weight version that produced any token of ``record``: what staleness is
    measured from. Partial rollout leaves per-token ``token_versions`` (a generation interrupted
    by a weight update continues under the new version); without them every token has
    ``weight_version``. For a trajectory only model tokens (``response_mask``) count."""
    versions = record.token_versions
    if isinstance(record, Trajectory) and versions:
        versions = [v for v, m in zip(versions, record.response_mask, strict=True) if m]
    return min(versions) if versions else record.weight_version


_ENCODER = msgspec.msgpack.Encoder()
_JSON_ENCODER = msgspec.json.Encoder()


def encode(obj: msgspec.Struct | list[Any]) -> bytes:
    """Encode a record (or a list of records) as msgpack bytes."""
    return _ENCODER.encode(obj)


def decode(data: bytes, type: type[T]) -> T:
    """Decode msgpack bytes into ``type`` (e.g. ``Trajectory`` or ``list[Trajectory]``), validating
    field types and the record's own invariants."""
    return msgspec.msgpack.decode(data, type=type)


def to_jsonl(records: Iterable[msgspec.Struct]) -> bytes:
    """One JSON object per line, for dumps a person reads (rollout-only mode)."""
    return b"".join(_JSON_ENCODER.encode(r) + b"\n" for r in records)


def iter_jsonl(data: bytes, type: type[T]) -> Iterator[T]:
    """Decode the lines of :func:`to_jsonl` output; an invalid line names its line number."""
    decoder = msgspec.json.Decoder(type)
    for lineno, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield decoder.decode(line)
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
            raise ValueError(f"line {lineno}: {exc}") from exc
