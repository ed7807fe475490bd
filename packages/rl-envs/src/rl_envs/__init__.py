"""Gym-like text environments, verifiable rewards and a sandbox for untrusted reward code."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rl-envs")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"
