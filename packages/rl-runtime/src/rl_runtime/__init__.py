"""Ray orchestration of the rl-* stack: worker groups, step loop blocks, tracking, checkpoints."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rl-runtime")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"
