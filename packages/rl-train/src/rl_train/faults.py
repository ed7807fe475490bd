"""Test-only fault injection: kill this process, for real, at a named point.

``RL_FAULT_INJECT="point@step,other@step"`` makes the process that reaches ``fault_point(point,
step)`` send itself SIGKILL (no cleanup, no ``finally``, no atexit), as the OOM killer or a
preempted node would. Unset (always, outside tests), a fault point is one dictionary lookup.
The kill test of the checkpoints uses it to die mid-step, mid-save and right after a save.
"""

from __future__ import annotations

import os
import signal

FAULT_ENV = "RL_FAULT_INJECT"


def fault_point(name: str, step: int) -> None:
    """SIGKILL this process when ``$RL_FAULT_INJECT`` lists ``name@step``."""
    spec = os.environ.get(FAULT_ENV)
    if spec and f"{name}@{step}" in (s.strip() for s in spec.split(",")):
        os.kill(os.getpid(), signal.SIGKILL)
