"""FSDP2 and DeepSpeed training backends for actor, critic and reference."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rl-train")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"
