"""Pure-tensor RL post-training algorithms: advantages, policy/value/KL/preference losses (torch only).

Submodules: ``advantages``, ``losses``, ``aggregate``, ``rewards``, ``kl_control``, ``logprobs``,
``correction``, ``preference`` (preference losses by name).  All tensors follow the ``[B, T]`` alignment of the workspace CONTRACT.
"""

from importlib.metadata import PackageNotFoundError, version

from rl_algos import (
    advantages,
    aggregate,
    correction,
    kl_control,
    logprobs,
    losses,
    preference,
    rewards,
)
from rl_algos.advantages import get_estimator, list_estimators, register_estimator
from rl_algos.aggregate import masked_mean, masked_sum, masked_whiten
from rl_algos.losses import PolicyLossOutput, get_policy_loss, kl_penalty, register_policy_loss

try:
    __version__ = version("rl-algos")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"

__all__ = [
    "PolicyLossOutput",
    "__version__",
    "advantages",
    "aggregate",
    "correction",
    "get_estimator",
    "get_policy_loss",
    "kl_control",
    "kl_penalty",
    "list_estimators",
    "logprobs",
    "losses",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "preference",
    "register_estimator",
    "register_policy_loss",
    "rewards",
]
