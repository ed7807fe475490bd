"""The protocol every training backend implements (FSDP2, DeepSpeed, single-process HF)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from rl_train.types import Batch, ForwardOutput, LossFn


@runtime_checkable
class TrainBackend(Protocol):
    """What the runtime drives. Every method is called on every data-parallel rank (SPMD)."""

    role: str
    rank: int
    world_size: int

    def forward(self, batch: Batch) -> ForwardOutput:
        """No-grad forward of this rank's batch: ``log_probs``/``entropy``/``values`` ``[B, T]``."""
        ...

    def train_step(
        self, batch: Batch, loss_fn: LossFn | None = None, *, epochs: int | None = None
    ) -> dict[str, float]:
        """``epochs`` (default ``ppo_epochs``) x mini-batches x micro-batches over this rank's
        batch; returns metrics."""
        ...

    def iter_full_tensor_buckets(
        self, bucket_bytes: int = 1 << 28, *, tied_once: bool = False
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """HF-named full (unsharded) tensors in buckets of about ``bucket_bytes``, on every rank;
        with ``tied_once``, a tied parameter under its first name only (a weight sync)."""
        ...

    def save_checkpoint(
        self,
        root: str | Path,
        step: int,
        extra: dict[str, Any] | None = None,
        *,
        key_file: str | Path | None = None,
    ) -> Path:
        """Atomically write a resumable checkpoint ``root/step-<step>`` (rl_train.checkpoint_store), its manifest signed with
        the key in ``key_file`` (default: :func:`rl_train.signing.default_key_file`)."""
        ...

    def load_checkpoint(
        self, root: str | Path, *, key_file: str | Path | None = None
    ) -> tuple[int, dict[str, Any]]:
        """Load the newest complete checkpoint under ``root`` (or a given one) whose signed
        manifest verifies under ``key_file``; ``(step, extra)``."""
        ...

    def export_hf(self, out_dir: str | Path) -> Path:
        """Write a transformers-loadable safetensors model (``save_pretrained``) from rank 0."""
        ...

    def offload(self) -> None:
        """Move parameters (and optimizer state) to CPU to free the device for rollout."""
        ...

    def onload(self) -> None:
        """Undo :meth:`offload`."""
        ...
