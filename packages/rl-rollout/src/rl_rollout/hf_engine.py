"""HFEngine: transformers models on any device, with continuous batching over a KV cache.

One scheduler thread owns the model. Between decode steps it admits pending sequences (a left-padded
prefill whose KV cache is merged into the running batch) and retires finished ones, so requests that
arrive while others are generating join the batch at the next step: env-level asynchrony in the
agent loop becomes real batching. Every row carries its own position ids (left padding never shifts
RoPE positions), its own sampling parameters and optionally its own seeded generator.

Shapes: the running batch holds ``B`` sequences; ``mask [B, L]`` marks real KV columns of the
cache (``L`` = longest row, left padded); the token sampled last for each row is not yet in the
cache and is fed by the next decode step.

Partial rollout: ``stage_weights`` validates and copies new weights aside and returns; the scheduler
swaps them in at the next decode-step boundary (no barrier: running sequences are not drained). The
KV cache of every running row was computed under the old weights, so right after the swap it is
recomputed (one batched prefill of ``prompt + output[:-1]`` under the new weights, no sampling) and
the next decode step feeds the last sampled token as usual. Every later token is therefore sampled
from, and its log-prob taken under, exactly the new policy; each token records the version that
sampled it (``GenerationResult.token_versions``). With ``recompute_kv_on_weight_update: false``
the running rows keep their KV cache across the swap (PipelineRL's in-flight update): no prefill,
and the tokens after it are sampled by the new weights attending to keys and values the old ones
computed for the earlier tokens. Their log-probs are recorded as sampled (the behaviour policy a
train-inference IS correction needs), but that policy is neither version's; a sample's lag is
its oldest token's version either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import functools
import threading
import time
import warnings
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rl_config.records import GenerationRequest, GenerationResult, SamplingParams
from rl_rollout.engine import (
    EngineAsleepError,
    EngineTimeoutError,
    check_requests,
    remote_code_flag,
)
from rl_rollout.gqa_attention import engine_attn_implementation
from rl_rollout.lean_decode import LeanDecoder, lean_decode_problem
from rl_rollout.sampling import (
    apply_repetition_penalty,
    draw_tokens,
    log_probs_of,
    sampling_scores,
)
from rl_sync.adapter import adapter_part

__all__ = ["HFEngine"]

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | str:
    """``"bf16"``/``"float32"``/torch dtype -> torch dtype; None/"auto" -> "auto"."""
    if dtype is None or dtype == "auto":
        return "auto"
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} unknown; use one of {sorted(_DTYPES)} or 'auto'")
    return _DTYPES[dtype]


@dataclass
class _Seq:
    request_id: str
    sample_index: int
    prompt_ids: list[int]
    sampling: SamplingParams
    generator: torch.Generator | None
    future: asyncio.Future[GenerationResult]
    loop: asyncio.AbstractEventLoop
    version: int = 0
    output_ids: list[int] = field(default_factory=list)
    output_log_probs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def result(self) -> GenerationResult:
        return GenerationResult(
            request_id=self.request_id,
            prompt_ids=self.prompt_ids,
            output_ids=list(self.output_ids),
            output_log_probs=list(self.output_log_probs),
            finish_reason=self.finish_reason or "abort",  # type: ignore[arg-type]
            weight_version=self.token_versions[0] if self.token_versions else self.version,
            sample_index=self.sample_index,
            stop_reason=self.stop_reason,
            token_versions=list(self.token_versions),
        )


@dataclass
class _StagedWeights:
    """Weights waiting for the next decode-step boundary: device copies keyed by HF name."""

    tensors: dict[str, torch.Tensor]
    version: int
    ticket: int


#: the strategy_config keys HFEngine reads (see HFEngine); any other is an error naming it
STRATEGY_CONFIG_KEYS = frozenset({
    "enable_prefix_caching",
    "prefix_cache_max_tokens",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "attn_implementation",
    "trust_remote_code",
    "recompute_kv_on_weight_update",
    "lean_decode",
})  # fmt: skip


def hf_takes_adapters(strategy_config: dict[str, Any]) -> bool:
    """HFEngine always takes adapter-only updates (it merges them into its base weights)."""
    del strategy_config
    return True


def hf_option_problems(strategy_config: dict[str, Any]) -> dict[str, str]:
    """``{key: why}`` for each strategy_config key HFEngine does not take (with the closest
    known one); empty when all are known."""
    known = sorted(STRATEGY_CONFIG_KEYS)
    problems = {}
    if "lean_decode" in strategy_config and not isinstance(strategy_config["lean_decode"], bool):
        problems["lean_decode"] = f"must be true or false, not {strategy_config['lean_decode']!r}"
    for key in sorted(set(strategy_config) - STRATEGY_CONFIG_KEYS):
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        problems[key] = f"is not an hf_infer option{hint} (its options: {', '.join(known)})"
    return problems


class HFEngine:
    """Generation with a transformers causal LM (see module docstring).

    strategy_config keys (ROLL's names where they exist): ``max_num_seqs`` (running batch size,
    default 64), ``max_num_batched_tokens`` (prompt tokens per prefill, default 8192),
    ``max_model_len`` (default: the model's max_position_embeddings), ``attn_implementation``
    (default "sdpa", run as `rl_rollout.gqa_attention`'s copy-free variant), ``trust_remote_code``
    (only False: the ``trust_remote_code`` argument alone allows remote code),
    ``enable_prefix_caching`` (default True: the KV of a finished sequence is kept, and a later
    prompt that extends it, i.e. the next turn of the same conversation, prefills only its new
    tokens; dropped on weight updates), ``prefix_cache_max_tokens`` (default 65536, LRU bound),
    ``recompute_kv_on_weight_update`` (default True: a weight swap during generation recomputes
    the running rows' KV cache under the new weights; False keeps it, see module docstring),
    ``lean_decode`` (default True: decode steps of Qwen2/Llama/Mistral models run through
    `rl_rollout.lean_decode`, fused projections without transformers' module calls; other models,
    and False, use transformers' forward; ``lean_decode_problem`` says why a model is not covered).
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
        from transformers import AutoConfig, AutoModelForCausalLM

        from rl_config.model_config import apply_model_config_overrides

        cfg = dict(strategy_config or {})
        problems = hf_option_problems(cfg)
        if problems:
            raise ValueError(
                "HFEngine strategy_config: "
                + "; ".join(f"{key} {why}" for key, why in sorted(problems.items()))
            )
        remote_code = remote_code_flag(cfg, trust_remote_code)
        if device is None:
            from rl_sync.device import torch_device

            device = torch_device()
        self.device = torch.device(device)
        self.model_path = str(model_path)
        extra: dict[str, Any] = {}
        if config_overrides:  # the model's config with the role's overrides
            config = AutoConfig.from_pretrained(self.model_path, trust_remote_code=remote_code)
            extra["config"] = apply_model_config_overrides(
                config, config_overrides, "actor_infer.model_args.model_config_kwargs"
            )
        self.model: Any = AutoModelForCausalLM.from_pretrained(
            self.model_path,
            dtype=resolve_dtype(dtype),
            attn_implementation=engine_attn_implementation(cfg.get("attn_implementation")),
            trust_remote_code=remote_code,
            **extra,
        )
        self.model.to(self.device).eval()
        self.max_num_seqs = int(cfg.get("max_num_seqs", 64))
        self.max_num_batched_tokens = int(cfg.get("max_num_batched_tokens", 8192))
        self.max_model_len = int(
            cfg.get("max_model_len", getattr(self.model.config, "max_position_embeddings", 4096))
        )
        self.enable_prefix_caching = bool(cfg.get("enable_prefix_caching", True))
        self.prefix_cache_max_tokens = int(cfg.get("prefix_cache_max_tokens", 65536))
        self.recompute_kv_on_weight_update = bool(cfg.get("recompute_kv_on_weight_update", True))
        self.lean_decode_problem = (
            lean_decode_problem(self.model) if cfg.get("lean_decode", True) else "turned off"
        )
        self._lean = LeanDecoder(self.model) if self.lean_decode_problem is None else None
        if cfg.get("lean_decode") is True and self._lean is None:
            warnings.warn(
                f"hf_infer lean_decode: true has no effect on this model "
                f"({self.lean_decode_problem}); decode steps use transformers' forward",
                stacklevel=2,
            )
        self._prefixes: OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = (
            OrderedDict()
        )
        self._prefix_tokens = 0
        self._eos_ids = _eos_ids(self.model)
        self._tokenizer: Any = None
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._version = 0
        self._asleep = 0
        self._weights_discarded = False
        self._saved_buffers: dict[str, torch.Tensor] = {}
        #: base weights (host copies) of the modules an adapter-only update adapts, taken at
        #: the first such update (`stage_weights`; rl_sync.adapter)
        self._adapter_base: dict[str, torch.Tensor] = {}
        # scheduler state
        self._cond = threading.Condition()
        self._model_lock = threading.Lock()
        self._pending: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._abort_ids: set[str] = set()
        self._staged: _StagedWeights | None = None
        self._staged_tickets = 0  # stage_weights calls so far
        self._applied_ticket = 0  # the last ticket swapped into the live model
        self._cache: Any = None
        self._mask: torch.Tensor | None = None
        self._shutdown = False
        self._thread: threading.Thread | None = None
        self.stats = {
            "decode_steps": 0,
            "prefills": 0,
            "max_running": 0,
            "prefix_hit_tokens": 0,
            "generated_tokens": 0,
            "weight_swaps": 0,
            "recomputed_tokens": 0,
            "lean_decode_steps": 0,
        }

    # ------------------------------------------------------------------ protocol
    @property
    def weight_version(self) -> int:
        return self._version

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Submit all samples of all requests at once; they batch with whatever else is running."""
        if self._asleep:
            raise EngineAsleepError("HFEngine.generate() called while asleep; call wake_up() first")
        if self._weights_discarded:
            raise EngineAsleepError(
                "HFEngine weights were discarded by sleep(2); update_weights first"
            )
        if self._shutdown:
            raise RuntimeError("HFEngine.generate() called after shutdown()")
        check_requests(requests, max_model_len=self.max_model_len)
        loop = asyncio.get_running_loop()
        seqs: list[_Seq] = []
        for req in requests:
            for index in range(req.sampling.n):
                gen = None
                if req.sampling.seed is not None:
                    gen = torch.Generator(device=self.device).manual_seed(
                        (req.sampling.seed * 1_000_003 + index) % (2**63)
                    )
                seqs.append(
                    _Seq(
                        req.request_id,
                        index,
                        list(req.prompt_ids),
                        req.sampling,
                        gen,
                        loop.create_future(),
                        loop,
                    )
                )
        self._ensure_thread()
        with self._cond:
            self._pending.extend(seqs)
            self._cond.notify_all()
        try:
            return list(await asyncio.gather(*(s.future for s in seqs)))
        except asyncio.CancelledError:
            self.abort({s.request_id for s in seqs})
            raise

    def update_weights(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        version: int,
        timeout_s: float = 600.0,
    ) -> None:
        """Stage the weights (:meth:`stage_weights`) and wait until they are live (at most
        ``timeout_s``; EngineTimeoutError past it). Running sequences continue under them."""
        ticket = self.stage_weights(named_tensors, version)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._applied_ticket < ticket:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EngineTimeoutError(
                        f"HFEngine weight update to version {version} was not applied within "
                        f"{timeout_s:g} s"
                    )
                self._cond.wait(timeout=left)

    def stage_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """Check and copy HF-named full tensors aside (no disk) and return at once; the scheduler
        swaps them into the live model at the next decode-step boundary and recomputes the KV
        cache of the running sequences (see module docstring). Unknown names and wrong shapes are
        errors here, naming the tensor. A second stage before the swap merges into the first
        (its tensors win, its version is taken). Returns a ticket: the swap is done once
        :attr:`applied_ticket` reaches it."""
        if self._asleep:
            raise EngineAsleepError("HFEngine.update_weights() while asleep; call wake_up() first")
        targets = self.model.state_dict(keep_vars=True)
        copies: dict[str, torch.Tensor] = {}
        factors: dict[str, dict[str, torch.Tensor]] = {}
        with torch.no_grad():
            for name, tensor in named_tensors:
                part = adapter_part(name)
                if part is not None:  # an adapter-only update: merged below
                    factors.setdefault(part[0], {})[part[1]] = tensor
                    continue
                if name not in targets:
                    raise KeyError(f"update_weights: parameter {name!r} is not in the model")
                target = targets[name]
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"update_weights: {name!r} has shape {tuple(tensor.shape)}, "
                        f"model expects {tuple(target.shape)}"
                    )
                copies[name] = tensor.detach().to(device=self.device, dtype=target.dtype, copy=True)
            copies.update(self._merge_adapter(factors, targets))
        with self._cond:
            self._staged_tickets += 1
            if self._staged is not None:
                copies = {**self._staged.tensors, **copies}
            self._staged = _StagedWeights(copies, int(version), self._staged_tickets)
            ticket = self._staged_tickets
            self._cond.notify_all()
            scheduler_alive = self._thread is not None and self._thread.is_alive()
        if not scheduler_alive or self._shutdown:  # nobody else will swap them in: do it now
            with self._model_lock:
                self._swap_staged_weights()
        return ticket

    def _merge_adapter(
        self, factors: dict[str, dict[str, torch.Tensor]], targets: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """``<module>.weight = W0 + B @ A`` for each module of an adapter-only update
        (rl_sync.adapter), W0 the module's weight as this engine loaded it: copied to the host
        at the first update that adapts it (the engine's weights are still the base model's
        then: every later update is merged from W0, never from the merged weights)."""
        from rl_sync.adapter import merge

        out: dict[str, torch.Tensor] = {}
        for module, parts in factors.items():
            name = f"{module}.weight"
            if name not in targets or set(parts) != {"A", "B"}:
                raise KeyError(
                    f"update_weights: adapter of {module!r} has factors {sorted(parts)} for "
                    f"{'a' if name in targets else 'no'} weight {name!r} of the model"
                )
            if name not in self._adapter_base:
                if self._weights_discarded:
                    raise EngineAsleepError(
                        "HFEngine: an adapter-only update needs the base weights, which "
                        "sleep(2) discarded; send the full weights"
                    )
                self._adapter_base[name] = targets[name].detach().to("cpu", copy=True)
            base = self._adapter_base[name].to(self.device)
            try:
                out[name] = merge(base, parts["A"], parts["B"]).to(targets[name].dtype)
            except ValueError as err:
                raise ValueError(f"update_weights: {module!r}: {err}") from None
        return out

    @property
    def applied_ticket(self) -> int:
        """The ticket of the last staged weights swapped into the live model."""
        return self._applied_ticket

    def _swap_staged_weights(self) -> bool:
        """Copy the staged weights into the live model (caller holds the model lock); recompute
        the running rows' KV cache under them (unless `recompute_kv_on_weight_update` is off).
        Returns whether anything was swapped."""
        with self._cond:
            staged, self._staged = self._staged, None
        if staged is None:
            return False
        targets = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, tensor in staged.tensors.items():
                targets[name].copy_(tensor)
        self._version = staged.version
        self._weights_discarded = False
        self._clear_prefixes()  # cached KV came from the old weights
        self.stats["weight_swaps"] += 1
        if self._running and self.recompute_kv_on_weight_update:
            with torch.inference_mode():
                self._recompute_running_kv()
        with self._cond:
            self._applied_ticket = staged.ticket
            self._cond.notify_all()
        return True

    def _recompute_running_kv(self) -> None:
        """Rebuild the KV cache of every running row, ``prompt + output[:-1]``, under the live
        weights (the last sampled token is fed by the next decode step, as always)."""
        rows = [s.prompt_ids + s.output_ids[:-1] for s in self._running]
        cache, mask = None, None
        for chunk in _chunks_by_tokens(rows, self.max_num_batched_tokens):  # in row order
            part_cache, part_mask, _logits = self._prefill_tokens(chunk)
            if cache is None or mask is None:
                cache, mask = part_cache, part_mask
            else:
                cache, mask = _merge_caches(cache, mask, part_cache, part_mask)
        self._cache, self._mask = cache, mask
        self.stats["recomputed_tokens"] += sum(len(r) for r in rows)

    def sleep(self, level: int = 1) -> None:
        """Free device memory: 1 = offload weights to CPU and drop the KV cache; 2 = discard weights."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        with self._cond:
            if self._running or self._pending:
                raise RuntimeError(
                    "HFEngine.sleep() with requests in flight; abort or await them first"
                )
        with self._model_lock:
            self._swap_staged_weights()
            self._cache, self._mask = None, None
            self._clear_prefixes()
            if level == 2:
                # buffers (e.g. RoPE inv_freq) are not weights: keep them on the host
                self._saved_buffers = {
                    n: b.detach().to("cpu", copy=True) for n, b in self.model.named_buffers()
                }
                self.model.to_empty(device="meta")
                self._weights_discarded = True
            else:
                self.model.to("cpu")
            self._asleep = level
        from rl_sync.device import empty_cache

        with contextlib.suppress(Exception):
            empty_cache()

    def wake_up(self) -> None:
        with self._model_lock:
            if self._asleep == 2:
                self.model.to_empty(device=self.device)
                with torch.no_grad():
                    for name, buf in self.model.named_buffers():
                        buf.copy_(self._saved_buffers[name].to(buf.device))
                self._saved_buffers = {}
                self.model.tie_weights()  # to_empty gives tied parameters separate storage
            elif self._asleep == 1:
                self.model.to(self.device)
            self._asleep = 0

    def abort(self, request_ids: Iterable[str]) -> None:
        ids = set(request_ids)
        with self._cond:
            self._abort_ids |= ids
            keep: deque[_Seq] = deque()
            for seq in self._pending:
                if seq.request_id in ids:
                    seq.finish_reason = "abort"
                    _resolve(seq)
                else:
                    keep.append(seq)
            self._pending = keep
            self._cond.notify_all()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._cond:
            for seq in [*self._pending, *self._running]:
                seq.finish_reason = "abort"
                _resolve(seq)
            self._pending.clear()
            self._running.clear()

    def state_dict_for_check(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    # ------------------------------------------------------------------ scheduler
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="hf-engine", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while (
                    not self._shutdown
                    and not self._pending
                    and not self._running
                    and self._staged is None
                ):
                    self._cond.wait()
                if self._shutdown:
                    return
                admit = self._take_admissible()
                aborted = set(self._abort_ids)
                self._abort_ids.clear()
            try:
                with self._model_lock:
                    with torch.inference_mode():
                        for seq in self._running:
                            if seq.request_id in aborted:
                                seq.finish_reason = "abort"
                        self._retire()
                    self._swap_staged_weights()  # a decode-step boundary: new weights go live
                    self._run_step(admit)
            except Exception as exc:  # fail every in-flight request loudly, keep the engine alive
                with self._cond:
                    for seq in [*admit, *self._running]:
                        if not seq.future.done():
                            seq.loop.call_soon_threadsafe(_set_exception, seq.future, exc)
                    self._running = []
                    self._cache, self._mask = None, None

    @torch.inference_mode()
    def _run_step(self, admit: list[_Seq]) -> None:
        if admit:  # prefill newcomers, then every running row decodes this step too
            for seq in admit:
                seq.version = self._version
            self._prefill(admit)
            self._retire()
        if self._running:
            self._decode_step()
        self._retire()

    def _take_admissible(self) -> list[_Seq]:
        admit: list[_Seq] = []
        budget = self.max_num_batched_tokens
        while self._pending and len(self._running) + len(admit) < self.max_num_seqs:
            nxt = self._pending[0]
            if admit and len(nxt.prompt_ids) > budget:
                break
            budget -= len(nxt.prompt_ids)
            admit.append(self._pending.popleft())
        return admit

    def _prefill(self, admit: list[_Seq]) -> None:
        """Prefill new rows (reusing a cached prefix where one matches), sample their first token,
        merge them into the running batch."""
        groups: list[tuple[Any, torch.Tensor, list[_Seq]]] = []
        fresh: list[_Seq] = []
        for seq in admit:
            hit = self._take_prefix(seq.prompt_ids) if self.enable_prefix_caching else None
            if hit is None:
                fresh.append(seq)
            else:
                groups.append(self._prefill_from_prefix(seq, *hit))
        if fresh:
            groups.append(self._prefill_fresh(fresh))
        self.stats["prefills"] += 1
        for cache, mask, rows in groups:
            if not self._running:
                self._cache, self._mask, self._running = cache, mask, list(rows)
            else:
                assert self._mask is not None
                self._cache, self._mask = _merge_caches(self._cache, self._mask, cache, mask)
                self._running.extend(rows)
        self.stats["max_running"] = max(self.stats["max_running"], len(self._running))

    def _prefill_fresh(self, rows: list[_Seq]) -> tuple[Any, torch.Tensor, list[_Seq]]:
        """Left-padded batched prefill of whole prompts; samples each row's first token."""
        cache, mask, logits = self._prefill_tokens([s.prompt_ids for s in rows])
        self._append_tokens(rows, logits)
        return cache, mask, rows

    def _prefill_tokens(self, rows: list[list[int]]) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """A fresh KV cache of left-padded ``rows``: (cache, mask [n, width], last logits [n, V])."""
        width = max(len(r) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, tokens in enumerate(rows):
            ids[row, width - len(tokens) :] = torch.tensor(tokens)
            mask[row, width - len(tokens) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = _new_cache(self.model.config)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return cache, mask, out.logits[:, -1, :]

    def _prefill_from_prefix(
        self, seq: _Seq, cached: int, layers: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[Any, torch.Tensor, list[_Seq]]:
        """Prefill only prompt[cached:] on top of the cached KV of prompt[:cached]."""
        cache = _new_cache(self.model.config)
        for layer_idx, (keys, values) in enumerate(layers):
            cache.update(keys, values, layer_idx)
        rest = seq.prompt_ids[cached:]
        total = len(seq.prompt_ids)
        out = self.model(
            input_ids=torch.tensor([rest], dtype=torch.long, device=self.device),
            attention_mask=torch.ones((1, total), dtype=torch.long, device=self.device),
            position_ids=torch.arange(cached, total, device=self.device).unsqueeze(0),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self._append_tokens([seq], out.logits[:, -1, :])
        self.stats["prefix_hit_tokens"] += cached
        return cache, torch.ones((1, total), dtype=torch.long, device=self.device), [seq]

    # ------------------------------------------------------------------ prefix cache
    def _take_prefix(
        self, prompt: list[int]
    ) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]] | None:
        """Pop the longest cached token prefix of ``prompt`` (strictly shorter than it)."""
        best: tuple[int, ...] | None = None
        for tokens in self._prefixes:
            n = len(tokens)
            if n < len(prompt) and (best is None or n > len(best)) and tuple(prompt[:n]) == tokens:
                best = tokens
        if best is None:
            return None
        layers = self._prefixes.pop(best)
        self._prefix_tokens -= len(best)
        return len(best), layers

    def _store_prefix(self, row: int, seq: _Seq) -> None:
        """Keep the KV of a finished row: tokens prompt + output[:-1] (the last sampled token was
        never fed). The row's real columns are the rightmost ones (left padding)."""
        assert self._mask is not None
        tokens = tuple(seq.prompt_ids + seq.output_ids[:-1])
        width = int(self._mask[row].sum().item())
        if width != len(tokens) or not tokens or len(tokens) > self.prefix_cache_max_tokens:
            return
        layers = [
            (
                layer.keys[row : row + 1, :, -width:].clone(),
                layer.values[row : row + 1, :, -width:].clone(),
            )
            for layer in self._cache.layers
        ]
        if tokens in self._prefixes:
            self._prefix_tokens -= len(tokens)
        self._prefixes[tokens] = layers
        self._prefix_tokens += len(tokens)
        while self._prefix_tokens > self.prefix_cache_max_tokens:
            old, _ = self._prefixes.popitem(last=False)
            self._prefix_tokens -= len(old)

    def _clear_prefixes(self) -> None:
        self._prefixes.clear()
        self._prefix_tokens = 0

    def _decode_step(self) -> None:
        assert self._mask is not None
        rows = self._running
        last = torch.tensor([s.output_ids[-1] for s in rows], dtype=torch.long, device=self.device)
        positions = torch.tensor(
            [[s.length - 1] for s in rows], dtype=torch.long, device=self.device
        )
        mask = torch.cat(
            [self._mask, torch.ones((len(rows), 1), dtype=self._mask.dtype, device=self.device)],
            dim=1,
        )
        if self._lean is not None:
            logits = self._lean.step(last, positions.view(-1), mask.bool(), self._cache)
            self.stats["lean_decode_steps"] += 1
        else:
            # The one new query of each row may attend to every real column: the padding mask
            # as sdpa's boolean [B, 1, 1, L] mask (transformers passes a 4D mask through
            # unchanged), instead of transformers rebuilding a causal mask from the 2D one.
            out = self.model(
                input_ids=last.unsqueeze(1),
                attention_mask=mask.bool()[:, None, None, :],
                position_ids=positions,
                past_key_values=self._cache,
                use_cache=True,
            )
            logits = out.logits[:, -1, :]
        self._mask = mask
        self._append_tokens(rows, logits)
        self.stats["decode_steps"] += 1

    def _append_tokens(self, rows: list[_Seq], logits: torch.Tensor) -> None:
        """Sample one token per row from logits [B, V]; record the log-prob of each token under
        the distribution it was drawn from (rl_rollout.sampling); check stops."""
        penalized = logits
        if any(s.sampling.repetition_penalty != 1.0 for s in rows):
            penalized = torch.stack(
                [
                    apply_repetition_penalty(
                        logits[i], s.prompt_ids + s.output_ids, s.sampling.repetition_penalty
                    ).to(logits.dtype)
                    for i, s in enumerate(rows)
                ]
            )
        temperatures = [s.sampling.temperature for s in rows]
        scores = sampling_scores(
            penalized,
            temperatures,
            [s.sampling.top_p for s in rows],
            [s.sampling.top_k for s in rows],
        )
        tokens = draw_tokens(scores, temperatures, [s.generator or self._generator for s in rows])
        log_probs = log_probs_of(scores, tokens).tolist()
        for seq, token, lp in zip(rows, tokens.tolist(), log_probs):
            seq.output_ids.append(int(token))
            seq.output_log_probs.append(float(lp))
            seq.token_versions.append(self._version)
            self._check_stop(seq, int(token))
        self.stats["generated_tokens"] += len(rows)

    def _check_stop(self, seq: _Seq, token: int) -> None:
        params = seq.sampling
        if token in self._eos_ids and not params.ignore_eos:
            seq.finish_reason, seq.stop_reason = "stop", None
        elif token in params.stop_token_ids:
            seq.finish_reason, seq.stop_reason = "stop", token
        elif params.stop and (hit := self._stop_string_hit(seq)) is not None:
            seq.finish_reason, seq.stop_reason = "stop", hit
        elif len(seq.output_ids) >= params.max_new_tokens or seq.length >= self.max_model_len:
            seq.finish_reason = "length"

    def _stop_string_hit(self, seq: _Seq) -> str | None:
        """A stop string completed by the newest token (searched in a decoded tail window)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        longest = max(len(s) for s in seq.sampling.stop)
        tail = self._tokenizer.decode(seq.output_ids[-(longest + 2) :], skip_special_tokens=False)
        before = self._tokenizer.decode(
            seq.output_ids[-(longest + 2) : -1], skip_special_tokens=False
        )
        for stop in seq.sampling.stop:
            if stop in tail and stop not in before:
                return stop
        return None

    def _retire(self) -> None:
        if not any(s.finish_reason for s in self._running):
            return
        keep = [i for i, s in enumerate(self._running) if not s.finish_reason]
        finished = [s for s in self._running if s.finish_reason]
        if self.enable_prefix_caching and self._cache is not None:
            for row, seq in enumerate(self._running):
                if seq.finish_reason in ("stop", "length"):
                    self._store_prefix(row, seq)
        if not keep:
            self._cache, self._mask = None, None
        else:
            assert self._mask is not None
            index = torch.tensor(keep, dtype=torch.long, device=self.device)
            mask = self._mask.index_select(0, index)
            first = int((mask.sum(0) > 0).nonzero()[0].item())  # drop all-padding left columns
            self._mask = mask[:, first:]
            for layer in self._cache.layers:
                layer.keys = layer.keys.index_select(0, index)[:, :, first:]
                layer.values = layer.values.index_select(0, index)[:, :, first:]
        with self._cond:  # state first, then wake the callers (sleep() checks _running)
            self._running = [self._running[i] for i in keep]
        for seq in finished:
            _resolve(seq)


def _new_cache(config: Any) -> Any:
    """A transformers `DynamicCache` whose full-attention layers grow in place (GrowingLayer)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    growing = _growing_layer_class()
    cache = DynamicCache(config=config)
    cache.layers = [growing() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def _lazy_init(layer: Any, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
    """``DynamicLayer.lazy_initialization``: transformers 5 takes keys and values, 4.57 (the
    vllm-ascend 0.11 stack's) keys only."""
    import inspect

    from transformers.cache_utils import DynamicLayer

    if len(inspect.signature(DynamicLayer.lazy_initialization).parameters) > 2:
        layer.lazy_initialization(key_states, value_states)
    else:
        layer.lazy_initialization(key_states)


@functools.cache
def _growing_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A `DynamicLayer` that appends new key/value columns into spare capacity instead of
        concatenating (which copies the whole cache at every decode step: quadratic in length).

        ``keys``/``values`` stay plain ``[B, H, L, D]`` tensors to every reader, here views of
        the first ``L`` columns of buffers ``[B, H, capacity, D]``. When the engine replaces them
        (retiring rows, merging batches), the next update copies them into a fresh buffer with
        spare room (capacity grows by half, at least `_MIN_SPARE` columns)."""

        _kbuf: torch.Tensor | None = None
        _vbuf: torch.Tensor | None = None

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                _lazy_init(self, key_states, value_states)
            keys, values = self.keys, self.values
            length = keys.shape[-2] if keys.dim() == 4 else 0
            new = key_states.shape[-2]
            kbuf, vbuf = self._kbuf, self._vbuf
            if (
                kbuf is None
                or vbuf is None
                or length + new > kbuf.shape[-2]
                or not _is_head_of(keys, kbuf)
                or not _is_head_of(values, vbuf)
            ):
                capacity = length + new + max(_MIN_SPARE, (length + new) // 2)
                kbuf = _with_capacity(keys if length else None, key_states, capacity)
                vbuf = _with_capacity(values if length else None, value_states, capacity)
                self._kbuf, self._vbuf = kbuf, vbuf
            kbuf[:, :, length : length + new].copy_(key_states)
            vbuf[:, :, length : length + new].copy_(value_states)
            self.keys = kbuf[:, :, : length + new]
            self.values = vbuf[:, :, : length + new]
            return self.keys, self.values

    return GrowingLayer


_MIN_SPARE = 64


def _is_head_of(view: torch.Tensor, buf: torch.Tensor) -> bool:
    """Whether ``view`` is ``buf[:, :, :L]`` (same storage, start, batch and strides)."""
    return (
        view.dim() == 4
        and view.data_ptr() == buf.data_ptr()
        and view.shape[:2] == buf.shape[:2]
        and view.shape[3] == buf.shape[3]
        and view.stride() == buf.stride()
    )


def _with_capacity(current: torch.Tensor | None, like: torch.Tensor, capacity: int) -> torch.Tensor:
    """A ``[B, H, capacity, D]`` buffer (dtype/device of ``like``) starting with ``current``."""
    b, h, _, d = like.shape
    buf = like.new_empty((b, h, capacity, d))
    if current is not None:
        buf[:, :, : current.shape[-2]].copy_(current)
    return buf


def _chunks_by_tokens(rows: list[list[int]], budget: int) -> list[list[list[int]]]:
    """Consecutive groups of ``rows`` of at most ``budget`` tokens each (a longer row alone)."""
    chunks: list[list[list[int]]] = []
    used = 0
    for row in rows:
        if not chunks or used + len(row) > budget:
            chunks.append([])
            used = 0
        chunks[-1].append(row)
        used += len(row)
    return chunks


def _merge_caches(cache_a: Any, mask_a: torch.Tensor, cache_b: Any, mask_b: torch.Tensor):
    """Concatenate two left-padded KV caches along the batch (both padded to the longer length)."""
    width = max(mask_a.shape[1], mask_b.shape[1])

    def pad(t: torch.Tensor, dim: int) -> torch.Tensor:
        missing = width - t.shape[dim]
        if missing == 0:
            return t
        shape = list(t.shape)
        shape[dim] = missing
        return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)

    for layer_a, layer_b in zip(cache_a.layers, cache_b.layers):
        layer_a.keys = torch.cat([pad(layer_a.keys, 2), pad(layer_b.keys, 2)], dim=0)
        layer_a.values = torch.cat([pad(layer_a.values, 2), pad(layer_b.values, 2)], dim=0)
    return cache_a, torch.cat([pad(mask_a, 1), pad(mask_b, 1)], dim=0)


def _eos_ids(model: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list | tuple):
            ids.update(int(e) for e in eos)
    return ids


def _set_result(future: asyncio.Future[GenerationResult], result: GenerationResult) -> None:
    if not future.done():
        future.set_result(result)


def _set_exception(future: asyncio.Future[GenerationResult], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _resolve(seq: _Seq) -> None:
    seq.loop.call_soon_threadsafe(_set_result, seq.future, seq.result())
