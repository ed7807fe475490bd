"""The generation engine protocol (async-first) shared by HFEngine and VLLMEngine.

Semantics every engine honours:

- ``await generate(requests)`` returns, for each request in order, ``sampling.n`` results
  (``sample_index`` 0..n-1). ``output_ids`` are exactly the sampled token ids, including a final
  eos/stop token when generation stopped on one (the agent loop trains on these very ids).
  ``output_log_probs[i]`` = log p(output_ids[i] | prompt, output_ids[:i]) under the distribution
  the token was drawn from: the model's logits after a repetition penalty, divided by the
  temperature, with top-k / top-p applied (vLLM's ``processed_logprobs``; greedy rows: temperature
  1). Without a repetition penalty that is what a teacher-forced trainer forward of the same
  sampling distribution computes (rl_train ``TrainingArgs.logprob_sampling``: temperature, top-k,
  top-p).
- ``finish_reason``: ``"stop"`` (eos, a stop token id or a stop string; ``stop_reason`` is the
  stop token id or string, None for eos), ``"length"`` (max_new_tokens), ``"abort"``.
- ``weight_version`` of a result: the engine's version when the sequence was admitted (the oldest
  weights that produced any of its tokens), so staleness checks are conservative.
  ``token_versions[i]``: the version of the weights that sampled ``output_ids[i]`` (and under which
  ``output_log_probs[i]`` was taken); engines always fill it.
- ``stage_weights(named_tensors, version) -> ticket`` (partial rollout): checks the tensors (unknown
  names and wrong shapes are errors naming them), keeps them aside and returns without waiting.
  The engine swaps them in at its next decode-step boundary, with no barrier: sequences in flight
  are not drained but continue under the new weights, their context recomputed under them (HF:
  the KV cache is re-prefilled; vLLM: the request is interrupted and resubmitted with its partial
  output as prompt), so every later token's log-prob is exactly the new policy's. A second stage
  before the swap merges into the first. ``applied_ticket`` reaches the ticket once it is live.
- ``update_weights(named_tensors, version)`` = ``stage_weights`` + wait until the swap is done
  (bounded); afterwards ``weight_version == version``. No disk round trip.
- ``sleep(level)`` frees device memory (1: weights offloaded to host memory, KV cache freed;
  2: weights discarded too, so the caller must ``update_weights`` after ``wake_up``).
  ``generate`` while asleep is an error.
- ``abort(request_ids)`` finishes those requests now with ``finish_reason="abort"`` and the
  tokens generated so far (partial rollout).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import torch

from rl_config.records import GenerationRequest, GenerationResult

__all__ = [
    "Engine",
    "EngineAsleepError",
    "EngineTimeoutError",
    "GeneratingEngine",
    "check_requests",
    "remote_code_flag",
]


class EngineAsleepError(RuntimeError):
    """generate() was called while the engine sleeps."""


class EngineTimeoutError(TimeoutError):
    """An engine operation did not finish within its timeout (the message names it)."""


@runtime_checkable
class GeneratingEngine(Protocol):
    """The part of :class:`Engine` the agent loop uses (wrappers and test doubles may stop here)."""

    @property
    def weight_version(self) -> int: ...

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]: ...


@runtime_checkable
class Engine(Protocol):
    """What the agent loop and the runtime need from a generation engine."""

    @property
    def weight_version(self) -> int: ...

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]: ...

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        """Stage and wait until live. Like `stage_weights`, it copies what it keeps before it
        returns: the caller may pass its live tensors and change them afterwards."""
        ...

    def stage_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> int: ...

    @property
    def applied_ticket(self) -> int: ...

    def sleep(self, level: int = 1) -> None: ...

    def wake_up(self) -> None: ...

    def abort(self, request_ids: Iterable[str]) -> None: ...

    def shutdown(self) -> None: ...

    def state_dict_for_check(self) -> dict[str, torch.Tensor]:
        """HF-named CPU copies of the live weights (tests compare them after update_weights)."""
        ...


def check_requests(requests: list[GenerationRequest], *, max_model_len: int | None) -> None:
    """Validate a batch: unique request ids, prompt + max_new_tokens within max_model_len."""
    seen: set[str] = set()
    for req in requests:
        if req.request_id in seen:
            raise ValueError(f"duplicate request_id {req.request_id!r} in one generate() call")
        seen.add(req.request_id)
        if max_model_len is not None and len(req.prompt_ids) >= max_model_len:
            raise ValueError(
                f"request {req.request_id!r}: prompt of {len(req.prompt_ids)} tokens does not fit "
                f"max_model_len={max_model_len}"
            )


def remote_code_flag(strategy_config: dict, trust_remote_code: bool) -> bool:
    """The ``trust_remote_code`` an engine gives its loader: its own argument (a real bool,
    default False). Pops ``strategy_config["trust_remote_code"]``, which may only repeat False
    (a config never turns remote code on; a string such as 'false' is refused, not truthy)."""
    value = strategy_config.pop("trust_remote_code", False)
    if value is not False:
        raise ValueError(
            f"strategy_config.trust_remote_code={value!r}: remote model code is never run from a "
            "config; remove the key (only the engine's own trust_remote_code argument allows it)"
        )
    if not isinstance(trust_remote_code, bool):
        raise TypeError(f"trust_remote_code must be a bool, got {trust_remote_code!r}")
    return trust_remote_code
