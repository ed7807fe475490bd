"""Test-only fault injection: kill this process, for real, at a named point.

``RL_FAULT_INJECT="point@step,other@step"`` makes the process that reaches ``fault_point(point,
step)`` send itself SIGKILL (no cleanup, no ``finally``, no atexit), as the OOM killer or a
preempted node would. Unset (always, outside tests), a fault point is one dictionary lookup.
The kill test of the checkpoints uses it to die mid-step, mid-save and right after a save.
``train.nan_weight@N`` is not a kill: a train step that ends at optimizer step N sets the first
element of the model's first ``*norm.weight`` parameter to NaN (:func:`poison_parameter`), so
the next step trains on a non-finite weight, as a corrupted update would leave it;
``step.nan_advantage@N`` (rl_runtime.step.policy_update) gives pipeline step N's actor update an
advantage that is NaN, as a reward function returning NaN would.
"""

from __future__ import annotations

import os
import signal
from typing import Any

FAULT_ENV = "RL_FAULT_INJECT"


def fault_active(name: str, step: int) -> bool:
    """Whether ``$RL_FAULT_INJECT`` lists ``name@step``."""
    spec = os.environ.get(FAULT_ENV)
    return bool(spec) and f"{name}@{step}" in (s.strip() for s in spec.split(","))


def fault_point(name: str, step: int) -> None:
    """SIGKILL this process when ``$RL_FAULT_INJECT`` lists ``name@step``."""
    if fault_active(name, step):
        os.kill(os.getpid(), signal.SIGKILL)


def poison_parameter(module: Any, suffix: str = "norm.weight") -> str | None:
    """Set element 0 of ``module``'s first parameter named ``*<suffix>`` (this rank's shard of
    it) to NaN; returns its name (None: no such parameter)."""
    import torch

    for name, param in module.named_parameters():
        if name.endswith(suffix):
            local = param.to_local() if hasattr(param, "to_local") else param
            if local.numel():
                with torch.no_grad():
                    local.view(-1)[0] = float("nan")
            return name
    return None
