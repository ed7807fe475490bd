"""Experiment schema (pydantic), YAML loading and wire records (msgspec) for the rl-* stack."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rl-config")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"
