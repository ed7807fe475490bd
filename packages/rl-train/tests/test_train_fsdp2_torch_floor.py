"""FSDP2 on gloo with torch < 2.10 summed the ranks' gradients (torch 2.7.1: grad norm x2 against
one process in test_train_distributed); fsdp2_train refuses it by name there."""

from __future__ import annotations

import pytest
import torch

from rl_train.backends import native


@pytest.mark.parametrize(
    ("version", "backend", "world", "refused"),
    [("2.7.1+cu126", "gloo", 2, True), ("2.9.0", "gloo", 4, True), ("2.10.0", "gloo", 2, False),
     ("2.13.0", "gloo", 2, False), ("2.7.1", "gloo", 1, False), ("2.7.1", "hccl", 2, False)],
)  # fmt: skip
def test_fsdp2_on_gloo_refuses_torch_before_2_10(monkeypatch, version, backend, world, refused):
    monkeypatch.setattr(torch, "__version__", version)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: backend)
    if refused:
        with pytest.raises(RuntimeError, match=r"needs torch >= 2.10 .*deepspeed_train"):
            native._check_fsdp2_gradient_average(world)
    else:
        native._check_fsdp2_gradient_average(world)
