"""The multi-turn agent loop: engine + env + tokenizer -> token-exact Trajectory records.

Token exactness: the conversation is kept as token ids. The first prompt is tokenised once; each
model turn appends exactly the engine's ``output_ids`` (``response_mask`` True, rollout log-probs
aligned); the env's answer appends the tokenised template suffix (close the assistant message if
the model did not, the next user message with the observation, the next assistant header;
``response_mask`` False). Generated text is decoded only to give the env its action; it is never
re-tokenised, so the tokens trained on are the tokens that were sampled.

Env-level asynchrony (``mode="async"``): every episode is an asyncio task that submits its next turn
as soon as its env has answered; at most ``max_running_requests`` requests are in flight (a
semaphore). Engines batch whatever is pending (HFEngine admits new requests between decode steps;
vLLM schedules continuously). ``mode="lockstep"`` is the baseline: every round generates one turn
for all live episodes with one batched call, then steps every env.

Single-turn tasks (RLVR) use the same loop: their env terminates after one step.

Partial rollout: a weight update that lands while a turn is generating does not interrupt the
episode. The engine continues the turn under the new weights (see ``rl_rollout.engine``); the env
is not reset or re-stepped, so its state carries across the update. ``Trajectory.token_versions``
holds, per token, the version that sampled it (model tokens, from the engine's
``token_versions``); prompt and env tokens hold the version that was live when they were appended
(never trained on). ``Trajectory.weight_version`` is the oldest version of any model token.

Bounded env steps: with ``env_step_timeout_s`` set (the default), every ``env.step`` runs on a
daemon thread of its own and the loop waits at most that long; an env that hangs or is too slow
ends its episode as failed (``termination_reason="error"``, ``error`` says so,
``metrics["env_timeout"] = 1``) while the other episodes go on. The stuck thread cannot be killed,
but it does not hold the loop or the process's exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from rl_config.records import GenerationRequest, GenerationResult, SamplingParams, Trajectory, Turn
from rl_rollout.engine import GeneratingEngine
from rl_rollout.templates import ChatTemplate, get_template

__all__ = ["DEFAULT_ENV_STEP_TIMEOUT_S", "AgentLoop", "EnvStepTimeoutError", "EpisodeSpec"]

#: Seconds one ``env.step`` may take before its episode is failed.
DEFAULT_ENV_STEP_TIMEOUT_S = 300.0


class EnvStepTimeoutError(TimeoutError):
    """An ``env.step`` did not answer within ``env_step_timeout_s``."""


@dataclass
class EpisodeSpec:
    """One episode to run: an env (rl_envs protocol), its reset seed and bookkeeping ids."""

    env: Any
    seed: int
    group_id: str = ""
    tag: str = ""
    traj_id: str | None = None


def _as_spec(item: Any, index: int) -> EpisodeSpec:
    if isinstance(item, EpisodeSpec):
        spec = item
    elif isinstance(item, tuple):
        spec = EpisodeSpec(*item)
    elif hasattr(item, "assignment") and hasattr(item, "env"):  # rl_envs.groups.EnvSlot
        a = item.assignment
        spec = EpisodeSpec(
            item.env, int(a.seed), str(a.group_id), str(a.tag), f"g{a.group_id}-e{a.env_id}"
        )
    else:
        raise TypeError(
            f"episode #{index}: expected EpisodeSpec, (env, seed[, group_id, tag]) or an EnvSlot, "
            f"got {type(item).__name__}"
        )
    if spec.traj_id is None:
        spec.traj_id = f"{spec.group_id or 'traj'}-{index}-{uuid.uuid4().hex[:8]}"
    return spec


@dataclass
class _Episode:
    """State of one running episode (token ids and bookkeeping)."""

    spec: EpisodeSpec
    token_ids: list[int] = field(default_factory=list)
    response_mask: list[bool] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    turns: list[Turn] = field(default_factory=list)
    turn_idx: int = 0
    done: bool = False
    termination: str = "max_steps"
    success: bool = False
    error: str | None = None
    env_timeout: bool = False
    token_versions: list[int] = field(default_factory=list)
    gen_s: float = 0.0
    env_s: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    def append(
        self,
        ids: list[int],
        *,
        model: bool,
        versions: list[int],
        log_probs: list[float] | None = None,
    ) -> None:
        self.token_ids.extend(ids)
        self.response_mask.extend([model] * len(ids))
        self.log_probs.extend(log_probs if log_probs is not None else [0.0] * len(ids))
        self.token_versions.extend(versions)

    def oldest_model_version(self) -> int | None:
        versions = [v for v, m in zip(self.token_versions, self.response_mask) if m]
        return min(versions) if versions else None


class AgentLoop:
    """Runs episodes of rl_envs environments against an Engine (see module docstring).

    Args:
        engine: any :class:`rl_rollout.engine.Engine` (only ``generate``/``weight_version`` used).
        tokenizer: the HF tokenizer of the engine's model.
        template: chat template name (``native`` = the tokenizer's own, or ``qwen2_5`` ...).
        max_tokens_per_step: max new tokens of one model turn (ROLL's ``max_tokens_per_step``).
        max_running_requests: bound on concurrently pending generate requests.
        sampling: base sampling parameters (``n`` must be 1; ``max_new_tokens`` is set per turn).
        max_sequence_length: budget of the whole conversation in tokens (ROLL's sequence_length);
            an episode that would exceed it ends with termination_reason ``"max_length"``.
        max_turns: cap on turns per episode (default: the env's ``max_steps``).
        mode: ``"async"`` (env-level asynchrony) or ``"lockstep"`` (baseline).
        env_step_in_thread: run ``env.step`` in worker threads (one per live episode, up to
            ``max_running_requests``) so slow env steps overlap each other and generation.
        env_step_timeout_s: seconds one ``env.step`` may take; past it the episode is failed
            (see module docstring). ``None``: unbounded (steps run inline or in the pool above).
    """

    def __init__(
        self,
        engine: GeneratingEngine,
        tokenizer: Any,
        *,
        template: str | ChatTemplate = "native",
        max_tokens_per_step: int = 128,
        max_running_requests: int = 64,
        sampling: SamplingParams | None = None,
        max_sequence_length: int = 4096,
        max_turns: int | None = None,
        mode: Literal["async", "lockstep"] = "async",
        env_step_in_thread: bool = False,
        env_step_timeout_s: float | None = DEFAULT_ENV_STEP_TIMEOUT_S,
    ) -> None:
        sampling = sampling or SamplingParams()
        if sampling.n != 1:
            raise ValueError(
                "AgentLoop sampling.n must be 1 (groups are separate envs with one seed)"
            )
        if max_tokens_per_step < 1:
            raise ValueError(f"max_tokens_per_step must be >= 1, got {max_tokens_per_step}")
        if max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {max_running_requests}")
        if env_step_timeout_s is not None and not env_step_timeout_s > 0:
            raise ValueError(f"env_step_timeout_s must be > 0 or None, got {env_step_timeout_s}")
        if mode not in ("async", "lockstep"):
            raise ValueError(f"mode must be 'async' or 'lockstep', got {mode!r}")
        self.engine = engine
        self.tokenizer = tokenizer
        self.template = (
            template if isinstance(template, ChatTemplate) else get_template(template, tokenizer)
        )
        self.max_tokens_per_step = max_tokens_per_step
        self.max_running_requests = max_running_requests
        self.max_sequence_length = max_sequence_length
        self.max_turns = max_turns
        self.mode = mode
        self.env_step_in_thread = env_step_in_thread
        self.env_step_timeout_s = env_step_timeout_s
        self._executor: ThreadPoolExecutor | None = None
        end_ids = self._encode(self.template.end_of_turn) if self.template.end_of_turn else []
        self._end_of_turn_id = end_ids[0] if len(end_ids) == 1 else None
        stop_ids = list(sampling.stop_token_ids)
        if self._end_of_turn_id is not None and self._end_of_turn_id not in stop_ids:
            stop_ids.append(self._end_of_turn_id)
        self.sampling = msgspec.structs.replace(
            sampling,
            max_new_tokens=max_tokens_per_step,
            stop=list(sampling.stop),
            stop_token_ids=stop_ids,
        )

    # ------------------------------------------------------------------ public
    async def run_episodes(self, envs_and_seeds: Iterable[Any]) -> list[Trajectory]:
        """Run one episode per item; returns trajectories in input order."""
        episodes = [_Episode(_as_spec(item, i)) for i, item in enumerate(envs_and_seeds)]
        for ep in episodes:
            self._start(ep)
        executor = None
        if self.env_step_in_thread and self.env_step_timeout_s is None:
            # one worker per live episode: slow env steps all overlap
            executor = ThreadPoolExecutor(
                max_workers=max(1, min(len(episodes), self.max_running_requests)),
                thread_name_prefix="env-step",
            )
        self._executor = executor
        try:
            if self.mode == "lockstep":
                await self._run_lockstep(episodes)
            else:
                semaphore = asyncio.Semaphore(self.max_running_requests)
                await asyncio.gather(*(self._run_async(ep, semaphore) for ep in episodes))
        finally:
            self._executor = None
            if executor is not None:
                executor.shutdown(wait=False)
        return [self._finish(ep) for ep in episodes]

    # ------------------------------------------------------------------ drivers
    async def _run_async(self, ep: _Episode, semaphore: asyncio.Semaphore) -> None:
        while (request := self._next_request(ep)) is not None:
            started = time.perf_counter()
            try:
                async with semaphore:
                    result = (await self.engine.generate([request]))[0]
            except Exception as exc:
                self._fail(ep, f"engine: {type(exc).__name__}: {exc}")
                return
            ep.gen_s += time.perf_counter() - started
            await self._consume(ep, result)

    async def _run_lockstep(self, episodes: list[_Episode]) -> None:
        while True:
            pending = [(ep, req) for ep in episodes if (req := self._next_request(ep)) is not None]
            if not pending:
                return
            for chunk_start in range(0, len(pending), self.max_running_requests):
                chunk = pending[chunk_start : chunk_start + self.max_running_requests]
                started = time.perf_counter()
                try:
                    results = await self.engine.generate([req for _, req in chunk])
                except Exception as exc:
                    for ep, _ in chunk:
                        self._fail(ep, f"engine: {type(exc).__name__}: {exc}")
                    continue
                elapsed = time.perf_counter() - started
                for ep, _ in chunk:
                    ep.gen_s += elapsed
                # the envs of a round step concurrently (as a thread pool would), then the barrier
                await asyncio.gather(
                    *(self._consume(ep, res) for (ep, _), res in zip(chunk, results))
                )

    # ------------------------------------------------------------------ episode steps
    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _start(self, ep: _Episode) -> None:
        env = ep.spec.env
        try:
            observation, _info = env.reset(seed=ep.spec.seed)
            messages = []
            system = env.system_prompt() if hasattr(env, "system_prompt") else None
            if system:
                messages.append({"role": "system", "content": system})
            instruction = env.instruction() if hasattr(env, "instruction") else ""
            first = self._turn_text(env, observation, 0)
            messages.append(
                {"role": "user", "content": f"{instruction}\n{first}" if instruction else first}
            )
            prompt = self._encode(self.template.prefix(messages))
            ep.append(prompt, model=False, versions=self._live_versions(len(prompt)))
            ep.prompt_length = len(ep.token_ids)
        except Exception as exc:
            self._fail(ep, f"env reset: {type(exc).__name__}: {exc}")

    def _turn_text(self, env: Any, observation: str, turn_idx: int) -> str:
        if hasattr(env, "turn_prompt"):
            return env.turn_prompt(observation, turn_idx, self.max_tokens_per_step)
        return observation

    def _turn_limit(self, ep: _Episode) -> int:
        env_steps = int(getattr(ep.spec.env, "max_steps", 1 << 30))
        return min(env_steps, self.max_turns) if self.max_turns is not None else env_steps

    def _next_request(self, ep: _Episode) -> GenerationRequest | None:
        if ep.done:
            return None
        if ep.turn_idx >= self._turn_limit(ep):
            ep.done, ep.termination = True, "max_steps"
            return None
        budget = min(self.max_tokens_per_step, self.max_sequence_length - len(ep.token_ids))
        if budget < 1:
            ep.done, ep.termination = True, "max_length"
            return None
        sampling = self.sampling
        if budget != sampling.max_new_tokens or sampling.seed is not None:
            seed = (
                None if sampling.seed is None else sampling.seed + 7919 * ep.turn_idx + ep.spec.seed
            )
            # every other field (repetition_penalty, stop, ...) carries over unchanged
            sampling = msgspec.structs.replace(sampling, n=1, max_new_tokens=budget, seed=seed)
        return GenerationRequest(
            request_id=f"{ep.spec.traj_id}/t{ep.turn_idx}",
            prompt_ids=list(ep.token_ids),
            sampling=sampling,
        )

    async def _consume(self, ep: _Episode, result: GenerationResult) -> None:
        """Append the model's tokens as generated, step the env, append its answer as tokens."""
        start = len(ep.token_ids)
        ep.append(
            list(result.output_ids),
            model=True,
            versions=list(result.token_versions)
            or [result.weight_version] * len(result.output_ids),
            log_probs=list(result.output_log_probs),
        )
        action_text = self.tokenizer.decode(result.output_ids, skip_special_tokens=True)
        turn_idx = ep.turn_idx
        ep.turn_idx += 1
        if result.finish_reason == "abort":
            ep.turns.append(
                Turn(turn_idx=turn_idx, start=start, end=len(ep.token_ids), action_text=action_text)
            )
            ep.done, ep.termination = True, "aborted"
            return
        env = ep.spec.env
        started = time.perf_counter()
        try:
            observation, reward, terminated, truncated, info = await self._step_env(
                env, action_text
            )
        except EnvStepTimeoutError:
            ep.turns.append(
                Turn(turn_idx=turn_idx, start=start, end=len(ep.token_ids), action_text=action_text)
            )
            ep.env_timeout = True
            self._fail(ep, f"env step: no answer within {self.env_step_timeout_s:g} s (timeout)")
            return
        except Exception as exc:
            ep.turns.append(
                Turn(turn_idx=turn_idx, start=start, end=len(ep.token_ids), action_text=action_text)
            )
            self._fail(ep, f"env step: {type(exc).__name__}: {exc}")
            return
        finally:
            ep.env_s += time.perf_counter() - started
        info = dict(info or {})
        ep.success = bool(info.get("success", ep.success))
        ep.turns.append(
            Turn(
                turn_idx=turn_idx,
                start=start,
                end=len(ep.token_ids),
                action_text=action_text,
                reward=float(reward),
                terminated=bool(terminated),
                truncated=bool(truncated),
                format_ok=bool(info.get("format_ok", True)),
                info=_plain(info),
            )
        )
        if terminated:
            ep.done, ep.termination = True, "success" if ep.success else "terminated"
            return
        if truncated or ep.turn_idx >= self._turn_limit(ep):
            ep.done, ep.termination = True, "max_steps"
            return
        closed = bool(result.output_ids) and result.output_ids[-1] == self._end_of_turn_id
        suffix_text = self.template.turn_suffix(
            self._turn_text(env, observation, ep.turn_idx), model_closed_turn=closed
        )
        suffix = self._encode(suffix_text)
        if len(ep.token_ids) + len(suffix) >= self.max_sequence_length:
            ep.done, ep.termination = True, "max_length"
            return
        ep.append(suffix, model=False, versions=self._live_versions(len(suffix)))

    def _live_versions(self, count: int) -> list[int]:
        return [self.engine.weight_version] * count

    async def _step_env(self, env: Any, action_text: str) -> Any:
        """``env.step(action_text)``, bounded by ``env_step_timeout_s`` (TimeoutError past it)."""
        if self.env_step_timeout_s is not None:
            future = _on_daemon_thread(env.step, action_text)
            try:
                return await asyncio.wait_for(future, self.env_step_timeout_s)
            except asyncio.TimeoutError:  # not the builtin on Python 3.10
                if future.cancelled():  # ours; an env's own TimeoutError is its error
                    raise EnvStepTimeoutError from None
                raise
        if self._executor is not None:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, env.step, action_text
            )
        return env.step(action_text)

    def _fail(self, ep: _Episode, error: str) -> None:
        ep.done, ep.termination, ep.error = True, "error", error

    def _finish(self, ep: _Episode) -> Trajectory:
        spec = ep.spec
        rewards = [t.reward for t in ep.turns]
        return Trajectory(
            traj_id=str(spec.traj_id),
            group_id=spec.group_id,
            tag=spec.tag,
            env_seed=int(spec.seed),
            token_ids=ep.token_ids,
            prompt_length=ep.prompt_length,
            response_mask=ep.response_mask,
            rollout_log_probs=ep.log_probs,
            turns=ep.turns,
            episode_reward=float(sum(rewards)),
            success=ep.success,
            termination_reason=ep.termination,  # type: ignore[arg-type]
            weight_version=(
                oldest
                if (oldest := ep.oldest_model_version()) is not None
                else self.engine.weight_version
            ),
            token_versions=ep.token_versions,
            failed=ep.error is not None,
            error=ep.error,
            timing={
                "generate_s": ep.gen_s,
                "env_s": ep.env_s,
                "total_s": time.perf_counter() - ep.started,
            },
            metrics={
                "num_turns": float(len(ep.turns)),
                "response_tokens": float(sum(ep.response_mask)),
                "env_timeout": float(ep.env_timeout),
                "format_ok_rate": (
                    sum(t.format_ok for t in ep.turns) / len(ep.turns) if ep.turns else 0.0
                ),
            },
        )


def _on_daemon_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future:
    """Run ``fn(*args)`` on a new daemon thread; its result or exception lands in the returned
    future of the running loop. Unlike an executor's threads, a stuck one never blocks exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():  # cancelled by the timeout meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def run() -> None:
        try:
            value, error = fn(*args), None
        except BaseException as exc:  # handed to the awaiting episode
            value, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is gone (the episode gave up)
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=run, name="env-step", daemon=True).start()
    return future


def _plain(info: dict[str, Any]) -> dict[str, Any]:
    """Keep JSON/msgpack-friendly info values only (records must encode)."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if isinstance(value, bool | int | float | str) or value is None:
            out[str(key)] = value
        elif isinstance(value, list | tuple) and all(
            isinstance(v, bool | int | float | str) for v in value
        ):
            out[str(key)] = list(value)
    return out
