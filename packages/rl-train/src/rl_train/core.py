"""The training loop every backend shares: epochs x mini-batches x micro-batches, global loss
normalisers, gradient accumulation, the non-finite guard, metrics, and the no-grad forward.

Backends subclass :class:`BackendCore` and provide the model-specific primitives
(``_train_forward``, ``_backward``, ``_finish_step``, ``_zero_grad``, checkpoint I/O).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rl_train import batching
from rl_train import dist as rdist
from rl_train.args import LogprobSampling, ModelArgs, TrainingArgs
from rl_train.export import hf_name
from rl_train.faults import fault_active, fault_point, poison_parameter
from rl_train.guard import NonFiniteGuard, any_rank_true, is_finite
from rl_train.losses import forward_sampling, reads_old_log_probs
from rl_train.modeling import (
    check_role,
    logits_at_outputs,
    teacher_topk_outputs,
    token_outputs,
)
from rl_train.shared_prefix import check_shared_prompt
from rl_train.types import Batch, ForwardOutput, LossContext, LossFn


def _micro_batches(mini: Batch, args: TrainingArgs, micro_batch_size: int) -> list[Batch]:
    if args.use_dynamic_batching:
        return batching.dynamic_micro_batches(
            mini, args.max_tokens_per_microbatch, packed=args.use_sequence_packing
        )
    return batching.split_micro_batches(mini, micro_batch_size)


def equalize_count(micro: list[Batch], target: int) -> list[tuple[Batch, bool]]:
    """Pad a rank's micro-batch list to ``target`` entries (every rank must run the same number of
    collective forward/backward passes): split the largest multi-row micro-batches, then add
    zero-weight copies of a 1-row batch. Returns ``(micro_batch, counts)`` pairs."""
    out = list(micro)
    while len(out) < target:
        sizes = [batching.batch_size(mb) for mb in out]
        i = max(range(len(out)), key=lambda j: sizes[j]) if out else -1
        if i >= 0 and sizes[i] > 1:
            half = sizes[i] // 2
            mb = out.pop(i)
            out[i:i] = [
                batching.select(mb, list(range(half))),
                batching.select(mb, list(range(half, sizes[i]))),
            ]
        else:
            break
    pairs = [(mb, True) for mb in out]
    while len(pairs) < target:
        pairs.append((pairs[-1][0] if pairs else micro[0], False))
    return pairs


def _max_over_ranks(value: int) -> int:
    if not rdist.is_dist() or rdist.world_size() == 1:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


class BackendCore:
    """Shared logic; a subclass sets ``model`` (the module to call), ``device``, ``grad_scale``."""

    strategy_name = "base"

    def __init__(
        self,
        *,
        role: str,
        args: TrainingArgs,
        model_args: ModelArgs,
        loss_fn: LossFn | None = None,
        packed_forward: bool | None = None,
    ) -> None:
        self.role = check_role(role)
        self.args = args
        self.model_args = model_args
        self.default_loss_fn = loss_fn
        self.rank = rdist.rank()
        self.world_size = rdist.world_size()
        self.guard = NonFiniteGuard(args.max_consecutive_nonfinite, role)
        self.global_step = 0  # applied optimizer steps
        self.packed = args.use_sequence_packing if packed_forward is None else packed_forward
        self.device = torch.device("cpu")
        self.device_kind = "cpu"
        self.grad_scale = 1.0  # multiplies every micro-batch loss before backward
        self.model: nn.Module

    # -- primitives a backend provides ------------------------------------------------------------
    def _train_forward(self, mb: Batch, sampling: LogprobSampling | None = None) -> ForwardOutput:
        """Outputs of ``mb`` with grad; log-probs of the ``sampling`` distribution (None: the
        configured ``logprob_sampling``)."""
        return token_outputs(
            self.model,
            self._to_device(mb),
            role=self.role,
            packed=self.packed,
            need_entropy=self.role == "actor",
            sampling=self.args.logprob_sampling if sampling is None else sampling,
            share_prompt=self.args.share_prompt_forward,
        )

    def _eval_forward(self, mb: Batch) -> ForwardOutput:
        if self.role == "actor" and self.args.sum_pi_squared:
            return token_outputs(
                self.model,
                self._to_device(mb),
                role=self.role,
                packed=self.packed,
                need_entropy=True,
                need_sum_pi_squared=True,
                sampling=self.args.logprob_sampling,
                share_prompt=self.args.share_prompt_forward,
            )
        return self._train_forward(mb)

    def _check_forward_options(self, model: nn.Module) -> None:
        """Refuse forward options the loaded (unwrapped) model cannot run, naming the key."""
        if self.args.share_prompt_forward:
            check_shared_prompt(self.role, packed=self.packed, model=model)

    def _backward(self, loss: torch.Tensor) -> None:
        raise NotImplementedError

    def _finish_step(self, loss_nonfinite: bool) -> tuple[float, bool]:
        """Clip, check and (unless skipped on any rank) apply the update; ``(grad_norm, skipped)``."""
        raise NotImplementedError

    def _zero_grad(self) -> None:
        raise NotImplementedError

    def _current_lr(self) -> float:
        return 0.0

    def _set_train_mode(self, training: bool) -> None:
        self.model.train(training)

    # -- helpers ------------------------------------------------------------------------------------
    def _to_device(self, batch: Batch) -> Batch:
        return {
            k: (v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
            for k, v in batch.items()
        }

    def _guarded_update(
        self, loss_nonfinite: bool, grad_norm: torch.Tensor | float, apply: Any, discard: Any
    ) -> tuple[float, bool]:
        """Shared skip rule for backends that see the grad norm before stepping."""
        norm = float(grad_norm)
        skip = self.guard.should_skip(loss_nonfinite or not is_finite(norm), None)
        if skip:
            discard()
        else:
            apply()
            self.global_step += 1
        return norm, skip

    # -- protocol -------------------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, batch: Batch) -> ForwardOutput:
        """No-grad forward in micro-batches of ``infer_batch_size`` (or the token budget);
        ``[B, T]`` outputs on CPU, float32, in the input row order."""
        self._set_train_mode(False)
        n = batching.batch_size(batch)
        if self.args.use_dynamic_batching:
            lengths = [int(x) for x in batching.seq_lens(batch).tolist()]
            groups = batching.token_budget_groups(
                lengths, self.args.max_tokens_per_microbatch, padded=not self.packed
            )
        else:
            step = self.args.infer_batch_size
            groups = [list(range(i, min(i + step, n))) for i in range(0, n, step)]
        target = _max_over_ranks(len(groups))
        t = int(batch["input_ids"].shape[1])
        result = {
            k: torch.zeros(n, t) for k in ("log_probs", "entropy", "values", "sum_pi_squared")
        }
        seen: set[str] = set()
        for i in range(target):
            idx = groups[i] if i < len(groups) else (groups[-1] if groups else [0])
            out = self._eval_forward(batching.select(batch, idx)).detach_cpu()
            if i >= len(groups):
                continue  # padding pass so every rank runs the same number of collectives
            for key in result:
                value = getattr(out, key)
                if value is not None:
                    result[key][torch.as_tensor(idx)] = value
                    seen.add(key)
        self._set_train_mode(True)
        return ForwardOutput(**{k: (v if k in seen else None) for k, v in result.items()})

    @torch.no_grad()
    def forward_topk(
        self, batch: Batch, k: int, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """No-grad: the model's next-token distribution at every position restricted to its
        ``k`` most likely tokens (0: all), ``(log_probs [B, T, k], ids [B, T, k])`` on CPU
        (rl_train.modeling.teacher_topk_outputs), in micro-batches of ``infer_batch_size``
        rows; every rank runs the same number of forwards."""
        self._set_train_mode(False)
        n = batching.batch_size(batch)
        step = self.args.infer_batch_size
        groups = [list(range(i, min(i + step, n))) for i in range(0, n, step)]
        parts: list[tuple[torch.Tensor, torch.Tensor]] = []
        for i in range(_max_over_ranks(len(groups))):
            idx = groups[i] if i < len(groups) else (groups[-1] if groups else [0])
            mb = self._to_device(batching.select(batch, idx))
            out = teacher_topk_outputs(self.model, mb, k=k, temperature=temperature)
            if i < len(groups):
                parts.append(out)
        self._set_train_mode(True)
        if not parts:
            raise ValueError(f"{self.role}: forward_topk of an empty batch")
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def train_step(
        self, batch: Batch, loss_fn: LossFn | None = None, *, epochs: int | None = None
    ) -> dict[str, float]:
        """Run ``epochs`` (default ``ppo_epochs``) passes over this rank's ``batch`` in mini-batches of
        ``per_device_train_batch_size * gradient_accumulation_steps`` samples (one optimizer step
        each), micro-batches of ``per_device_train_batch_size`` samples (or a token budget).

        The loss of each micro-batch is normalised by the mini-batch's GLOBAL counts (all ranks),
        so accumulation and data parallelism reproduce one process on the whole mini-batch.
        A mini-batch with no trainable token on any rank (every response masked out, e.g. by
        ``max_len_mask``) is skipped whole: no forward, no optimizer step (AdamW would still move
        the weights by its momentum and weight decay), counted in ``<role>/empty_mini_batches``.
        """
        if self.role == "reference":
            raise RuntimeError("the reference role is forward-only; train_step is not available")
        loss_fn = loss_fn or self.default_loss_fn
        if loss_fn is None:
            raise ValueError(f"{self.role}: no loss_fn given and none configured")
        args = self.args
        passes = args.ppo_epochs if epochs is None else epochs
        if passes < 1:
            raise ValueError(f"{self.role}: train_step epochs must be >= 1, got {passes}")
        sampling = forward_sampling(loss_fn, args.logprob_sampling)
        logits_key: str | None = getattr(loss_fn, "logits_at", None)
        t0 = time.perf_counter()  # the old-policy forward counts as training time
        needs_old = reads_old_log_probs(loss_fn) and "old_log_probs" not in batch
        if needs_old and passes > 1:  # every row is revisited after the first step
            batch = self._with_old_log_probs(batch)
            needs_old = False
        self._set_train_mode(True)
        gen = (
            torch.Generator().manual_seed(args.seed + self.global_step)
            if args.shuffle_mini_batches
            else None
        )
        sums: dict[str, float] = {}
        steps = skipped = empty = 0
        grad_norms: list[float] = []
        tokens = 0.0
        for _epoch in range(passes):
            minis = batching.split_mini_batches(batch, args.mini_batch_size, shuffle_generator=gen)
            num_minis = _max_over_ranks(len(minis))
            if num_minis != len(minis) or _max_over_ranks(-len(minis)) != -len(minis):
                raise ValueError(
                    f"{self.role}: ranks hold different numbers of mini-batches ({len(minis)} here); "
                    "give every rank the same number of samples"
                )
            if needs_old and len(minis) > 1:
                minis = self._with_old_log_probs_after_first(minis)
            for mini in minis:
                micro = _micro_batches(mini, args, args.per_device_train_batch_size)
                pairs = equalize_count(micro, _max_over_ranks(len(micro)))
                resp = (
                    mini["response_mask"].to(torch.bool)
                    if "response_mask" in mini
                    else mini["attention_mask"].to(torch.bool)
                )
                g_tokens, g_seqs = rdist.all_reduce_sum(
                    [float(resp.sum()), float((resp.sum(-1) > 0).sum())], None
                )
                ctx = LossContext(
                    global_tokens=g_tokens,
                    global_seqs=g_seqs,
                    max_seq_len=_max_over_ranks(int(mini["input_ids"].shape[1])),
                )
                if g_tokens == 0:  # the same on every rank: all skip together
                    empty += 1
                    continue
                tokens += g_tokens
                self._zero_grad()
                nonfinite = False
                step_sums: dict[str, float] = {}
                for mb, counts in pairs:
                    if logits_key is None:
                        out = self._train_forward(mb, sampling)
                    else:  # a distribution-level loss: the logits at the ids it names
                        out = logits_at_outputs(self.model, self._to_device(mb), logits_key)
                    loss, metrics = loss_fn(self._to_device(mb), out, ctx)
                    if not counts:
                        loss = loss * 0.0
                    elif not is_finite(loss.detach()):
                        nonfinite = True
                    self._backward(loss * self.grad_scale)
                    if counts:
                        step_sums["loss"] = step_sums.get("loss", 0.0) + float(loss.detach())
                        for key, value in metrics.items():
                            step_sums[key] = step_sums.get(key, 0.0) + float(value)
                grad_norm, was_skipped = self._finish_step(nonfinite)
                fault_point("train.after_optimizer_step", self.global_step)
                steps += 1
                skipped += int(was_skipped)
                if not was_skipped:
                    grad_norms.append(grad_norm)
                for key, value in step_sums.items():
                    sums[key] = sums.get(key, 0.0) + value
        if fault_active("train.nan_weight", self.global_step):
            poison_parameter(self._module())
        keys = sorted(sums)
        totals = rdist.all_reduce_sum([sums[k] for k in keys], None)
        elapsed = time.perf_counter() - t0
        prefix = self.role
        metrics_out = {f"{prefix}/{k}": v / max(1, steps) for k, v in zip(keys, totals)}
        metrics_out.update(
            {
                f"{prefix}/grad_norm": sum(grad_norms) / len(grad_norms)
                if grad_norms
                else float("nan"),
                f"{prefix}/lr": self._current_lr(),
                f"{prefix}/optimizer_steps": float(steps),
                f"{prefix}/skipped_steps": float(skipped),
                f"{prefix}/empty_mini_batches": float(empty),
                f"{prefix}/nonfinite_total": float(self.guard.total_skipped),
                f"{prefix}/global_step": float(self.global_step),
                f"{prefix}/response_tokens_per_s": tokens / max(elapsed, 1e-9),
            }
        )
        return metrics_out

    def _with_old_log_probs(self, batch: Batch) -> Batch:
        """``batch`` with the policy loss's ``old_log_probs``: a no-grad forward of the policy as
        it is at the start of the call (``ppo_epochs`` > 1: every row is trained again after the
        weights change)."""
        return {**batch, "old_log_probs": self._policy_log_probs(batch)}

    def _policy_log_probs(self, batch: Batch) -> torch.Tensor:
        """``[B, T]`` no-grad log-probs of the policy as it is now."""
        old = self.forward(batch).log_probs
        assert old is not None  # an actor's forward always gives log-probs
        return old

    def _with_old_log_probs_after_first(self, minis: list[Batch]) -> list[Batch]:
        """One pass over several mini-batches: the first trains before any optimizer step, so the
        policy loss takes its old log-probs from that training forward (detached, ratio exactly 1:
        no extra pass, as with a single step); the later ones get a no-grad forward of the policy
        as it is now, before the first step changes it. Saves the forward over the first
        mini-batch that a whole-batch pass would spend (half of it with 2 optimizer steps per
        batch). Every rank holds the same number of mini-batches, so all run this forward."""
        later = minis[1:]
        old = self._policy_log_probs(batching.concat(later))
        parts = old.split([batching.batch_size(m) for m in later])
        return [minis[0], *({**m, "old_log_probs": o} for m, o in zip(later, parts))]

    def _module(self) -> nn.Module:
        """The HF model under any engine wrapper (DeepSpeed's engine holds it as ``module``)."""
        return self.model

    @property
    def has_adapters(self) -> bool:
        """Whether the model trains LoRA adapters (:mod:`rl_train.lora`)."""
        return self.model_args.lora is not None and self.role != "reference"

    @torch.no_grad()
    def forward_base(self, batch: Batch) -> ForwardOutput:
        """:meth:`forward` of the base model, the LoRA adapters bypassed: the reference
        log-probs of a LoRA-trained actor whose reference is its base model, without a second
        copy of the model (``[B, T]`` outputs as :meth:`forward`)."""
        from rl_train.lora import adapters_disabled

        if not self.has_adapters:
            raise ValueError(f"{self.role}: forward_base needs LoRA adapters (model_args.lora)")
        with adapters_disabled(self._module()):
            return self.forward(batch)

    def any_rank(self, flag: bool) -> bool:
        return any_rank_true(flag)

    def iter_full_tensor_buckets(
        self, bucket_bytes: int = 1 << 28, *, tied_once: bool = False
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """HF-named full tensors of the model in buckets of about ``bucket_bytes``; with LoRA
        adapters, the merged model (:func:`rl_train.lora.merge_adapters`). ``tied_once``: leave
        out the names of :meth:`tied_aliases` (what a weight sync sends: the engine's model ties
        them as this one does; a state dict, an export or a checksum keeps every name)."""
        named = self._iter_full_tensors()
        if self.has_adapters:
            from rl_train.lora import merge_adapters, scalings

            named = merge_adapters(named, scalings(self._module()))
        if tied_once:
            aliases = self.tied_aliases()
            named = ((name, tensor) for name, tensor in named if name not in aliases)
        yield from _buckets(named, bucket_bytes)

    def tied_aliases(self) -> frozenset[str]:
        """HF names under which a parameter appears again after its first name: a tied LM head
        (``lm_head.weight`` is ``model.embed_tokens.weight`` when ``tie_word_embeddings``)."""
        seen: set[int] = set()
        aliases: set[str] = set()
        for name, param in self._module().named_parameters(remove_duplicate=False):
            if id(param) in seen:
                aliases.add(hf_name(name))
            seen.add(id(param))
        return frozenset(aliases)

    def iter_adapter_buckets(
        self, bucket_bytes: int = 1 << 28
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The LoRA adapter as an adapter-only weight payload (:mod:`rl_sync.adapter`: each
        module's A and scaled B), in buckets of about ``bucket_bytes``; collective as
        :meth:`iter_full_tensor_buckets`."""
        from rl_train.lora import adapter_payload, scalings

        if not self.has_adapters:
            raise ValueError(f"{self.role}: no LoRA adapter (model_args.lora) to send")
        yield from _buckets(
            adapter_payload(self._iter_full_tensors(), scalings(self._module())), bucket_bytes
        )

    def _iter_full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        raise NotImplementedError

    def export_hf(self, out_dir: str | Path) -> Path:
        """The model as an HF directory (with LoRA: the merged model)."""
        from rl_train.export import export_hf

        return export_hf(self, Path(out_dir))

    def export_adapter(self, out_dir: str | Path) -> Path:
        """The LoRA adapter as a peft adapter directory (:func:`rl_train.lora.export_adapter`)."""
        from rl_train.lora import export_adapter

        return export_adapter(self, out_dir)


def _buckets(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """`named` tensors in consecutive lists of about `bucket_bytes` each (the last may be less)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket
