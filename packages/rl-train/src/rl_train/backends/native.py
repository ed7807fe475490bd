"""PyTorch-native backends: ``fsdp2_train`` (FSDP2 ``fully_shard`` per decoder layer + root,
mixed precision, CPU offload, activation checkpointing) and ``hf_infer`` (one unsharded HF model per
process: the reference role, or single-process training).

``fsdp2_train`` with one rank, no CPU offload and no dtype casts (``param_dtype`` and, for a trained
role, ``reduce_dtype`` equal to the weights' dtype) has nothing to shard, gather or cast: FSDP2
would add only its hooks and DTensor bookkeeping (a third of a tiny model's training step on the
CPU). It then trains the plain module, with identical results (bit for bit) and checkpoints in the
same DCP format, which a job with more ranks reshards on load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from rl_sync.device import empty_cache
from rl_train import dist as rdist
from rl_train.args import ModelArgs, TrainingArgs
from rl_train.backends import dcp_io
from rl_train.core import BackendCore
from rl_train.export import full_tensors_from_module
from rl_train.modeling import (
    DTYPES,
    compile_decoder_layers,
    decoder_layers,
    enable_gradient_checkpointing,
    load_model,
    resolve_compile_layers,
    resolve_fused_lm_head,
)
from rl_train.optim import build_optimizer, build_scheduler
from rl_train.types import LossFn

_FSDP_KEYS = {
    "param_dtype",
    "reduce_dtype",
    "cpu_offload",
    "reshard_after_forward",
    "gradient_checkpointing",
    "keep_last",
    "packed_forward",
    "offload_reference",
    "fused_lm_head",
    "compile_layers",
}


def fsdp2_changes_training(
    world_size: int,
    cfg: dict[str, Any],
    compute_dtype: torch.dtype,
    weights_dtype: torch.dtype,
    *,
    trained: bool,
) -> bool:
    """Whether FSDP2's ``fully_shard`` changes what a rank computes or stores: more than one rank
    (sharding), CPU offload, or a cast between the weights' dtype and the compute dtype
    (``param_dtype``, default the model's dtype) or, for a trained role, the gradient reduction's
    (``reduce_dtype``, default fp32). Otherwise it only adds hooks to the plain module."""
    if world_size > 1 or cfg.get("cpu_offload"):
        return True
    param_dtype = DTYPES[cfg["param_dtype"]] if "param_dtype" in cfg else compute_dtype
    reduce_dtype = DTYPES[cfg.get("reduce_dtype", "fp32")]
    return param_dtype != weights_dtype or (trained and reduce_dtype != weights_dtype)


class NativeBackend(BackendCore):
    """One class for both native strategies; ``shard`` selects FSDP2."""

    def __init__(
        self,
        *,
        strategy_name: str,
        role: str,
        model_path: str | Path,
        strategy_config: dict[str, Any],
        args: TrainingArgs,
        model_args: ModelArgs,
        loss_fn: LossFn | None = None,
    ) -> None:
        cfg = dict(strategy_config or {})
        unknown = set(cfg) - _FSDP_KEYS
        if unknown:
            raise ValueError(f"strategy_config of {strategy_name}: unknown keys {sorted(unknown)}")
        super().__init__(
            role=role,
            args=args,
            model_args=model_args,
            loss_fn=loss_fn,
            packed_forward=cfg.get("packed_forward"),
        )
        self.strategy_name = strategy_name
        self.keep_last = cfg.get("keep_last")
        self.model_path = str(model_path)
        self.last_load_report = None
        self.device_kind, self.device = rdist.init_distributed()
        self.rank, self.world_size = rdist.rank(), rdist.world_size()
        fsdp2 = strategy_name == "fsdp2_train"
        if not fsdp2 and self.world_size > 1 and role != "reference":
            raise ValueError(
                "hf_infer trains in one process only; use fsdp2_train or deepspeed_train "
                f"with {self.world_size} ranks"
            )
        compute_dtype = DTYPES[model_args.dtype]
        # FSDP2 keeps float32 master weights and computes in param_dtype; hf_infer loads as is.
        load_dtype = torch.float32 if (fsdp2 and role != "reference") else compute_dtype
        #: whether the model is wrapped with FSDP2's fully_shard (module docstring)
        self.shard = fsdp2 and fsdp2_changes_training(
            self.world_size, cfg, compute_dtype, load_dtype, trained=role != "reference"
        )
        model = load_model(
            model_path,
            role,
            model_args,
            dtype=load_dtype,
            seed=args.seed,
            device_kind=self.device_kind,
            fused_lm_head=resolve_fused_lm_head(cfg.get("fused_lm_head"), self.device_kind),
        )
        self.hf_config = model.config
        self._check_forward_options(model)
        self.hf_model_class = type(model)
        use_gc = bool(
            cfg.get("gradient_checkpointing", not model_args.disable_gradient_checkpointing)
        )
        if use_gc and role != "reference":
            enable_gradient_checkpointing(model)
        if resolve_compile_layers(cfg.get("compile_layers")):
            compile_decoder_layers(model)
        if self.shard:
            model = self._fully_shard(model, cfg, compute_dtype)
            self.grad_scale = float(self.world_size)  # FSDP2 averages gradients over ranks
        else:
            model = model.to(self.device)
        self.model = model
        self.offload_reference = bool(cfg.get("offload_reference", False))
        if role == "reference":
            model.requires_grad_(False)
            self.optimizer = None
            self.scheduler = None
        else:
            self.optimizer = build_optimizer(model.parameters(), args)
            self.scheduler = build_scheduler(self.optimizer, args)

    def _fully_shard(self, model: torch.nn.Module, cfg: dict[str, Any], compute_dtype: torch.dtype):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            MixedPrecisionPolicy,
            OffloadPolicy,
            fully_shard,
        )

        if not rdist.is_dist():
            raise RuntimeError(
                "fsdp2_train needs a process group: launch with RANK/WORLD_SIZE set "
                "(torchrun, rl_train.dist.spawn or the runtime's worker group)"
            )
        _check_fsdp2_gradient_average(self.world_size)
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        param_dtype = DTYPES[cfg["param_dtype"]] if "param_dtype" in cfg else compute_dtype
        reduce_dtype = DTYPES[cfg.get("reduce_dtype", "fp32")]
        mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        offload = CPUOffloadPolicy() if cfg.get("cpu_offload") else OffloadPolicy()
        reshard = bool(cfg.get("reshard_after_forward", True))
        for layer in decoder_layers(model):
            fully_shard(
                layer,
                mesh=mesh,
                mp_policy=mp,
                offload_policy=offload,
                reshard_after_forward=reshard,
            )
        fully_shard(
            model, mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=reshard
        )
        return model

    # -- primitives -------------------------------------------------------------------------------
    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def _zero_grad(self) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)

    def _finish_step(self, loss_nonfinite: bool) -> tuple[float, bool]:
        assert self.optimizer is not None and self.scheduler is not None
        max_norm = self.args.max_grad_norm if self.args.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()  # type: ignore[union-attr]

        def apply() -> None:
            assert self.optimizer is not None and self.scheduler is not None
            self.optimizer.step()
            self.scheduler.step()

        return self._guarded_update(loss_nonfinite, norm, apply, self._zero_grad)

    def _current_lr(self) -> float:
        return 0.0 if self.optimizer is None else float(self.optimizer.param_groups[0]["lr"])

    def _eval_forward(self, mb):
        if self.role == "reference" and self.offload_reference:
            self.onload()
        return super()._eval_forward(mb)

    def _iter_full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from full_tensors_from_module(self.model)

    # -- checkpoints ------------------------------------------------------------------------------
    def save_checkpoint(
        self,
        root: str | Path,
        step: int,
        extra: dict[str, Any] | None = None,
        *,
        key_file: str | Path | None = None,
    ) -> Path:
        return dcp_io.save(self, root, step, extra, key_file)

    def load_checkpoint(
        self, root: str | Path, *, key_file: str | Path | None = None
    ) -> tuple[int, dict[str, Any]]:
        return dcp_io.load(self, root, key_file)

    # -- colocation -------------------------------------------------------------------------------
    def _move(self, device: torch.device) -> None:
        if self.device_kind == "cpu":
            return  # parameters already live in host memory
        # Module.to, not `p.data = ...`: FSDP2's `_apply` keeps its sharded DTensors consistent
        self.model.to(device)
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and value.dim() > 0:
                        state[key] = value.to(device, non_blocking=True)
        if device.type == "cpu":
            empty_cache(self.device_kind)  # type: ignore[arg-type]

    def offload(self) -> None:
        self._move(torch.device("cpu"))

    def onload(self) -> None:
        self._move(self.device)


def fsdp2_averages_over_gloo() -> bool:
    """Whether this torch's FSDP2 averages gradients over gloo (CPU) ranks (torch >= 2.10); on an
    older torch ``fsdp2_train`` with several gloo ranks is refused."""
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    return version >= (2, 10)


def _check_fsdp2_gradient_average(world_size: int) -> None:
    """FSDP2 averages gradients over ranks (the loss scaling above relies on it). On gloo (CPU)
    with torch 2.7.1 the ranks' gradients came out summed (grad norm x world size against one
    process; torch 2.10 averages): refused there rather than trained with the wrong scale."""
    if world_size < 2 or torch.distributed.get_backend() != "gloo":
        return
    if not fsdp2_averages_over_gloo():
        raise RuntimeError(
            f"fsdp2_train with {world_size} ranks on gloo (CPU) needs torch >= 2.10 (torch "
            f"{torch.__version__} sums FSDP2's gradients over gloo ranks instead of averaging "
            "them); use torch >= 2.10, one rank, or deepspeed_train"
        )
