"""`SamplingParams` from ROLL's generating_args."""

from __future__ import annotations

from typing import Any

from rl_config.records import SamplingParams


def build_sampling(gen: Any, max_new_tokens: int) -> SamplingParams:
    """generating_args -> SamplingParams (do_sample: false = greedy; top_k 0 = off)."""
    greedy = not gen.do_sample or gen.temperature == 0
    return SamplingParams(
        temperature=0.0 if greedy else gen.temperature,
        top_p=1.0 if greedy else gen.top_p,
        top_k=-1 if greedy or gen.top_k <= 0 else gen.top_k,
        max_new_tokens=max_new_tokens,
        repetition_penalty=gen.repetition_penalty,
        stop=list(gen.stop_strings or []),
    )
