"""Pure-tensor RL post-training algorithms: advantages, policy/value/KL/preference losses (torch only)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rl-algos")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"
