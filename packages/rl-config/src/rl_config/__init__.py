"""Experiment schema (pydantic), YAML loading and wire records (msgspec) for the rl-* stack."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rl-config")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"

from rl_config.cli_args import AppArgs, parse_app_args
from rl_config.errors import ConfigError, ConfigIssue
from rl_config.explain import FieldDoc, explain
from rl_config.extras import Extra, missing_extras, required_extras
from rl_config.loading import LIBRARY_DIR, compose_config, load_config, load_yaml_dict
from rl_config.ranges import parse_device_list
from rl_config.redact import dump_resolved, redact
from rl_config.schema import (
    AsyncConfig,
    CustomEnv,
    EnvManagerConfig,
    ExperimentConfig,
    GeneratingArgs,
    ModelArgs,
    StrategyArgs,
    TrainingArgs,
    WorkerConfig,
)

__all__ = [
    "LIBRARY_DIR",
    "AppArgs",
    "AsyncConfig",
    "ConfigError",
    "ConfigIssue",
    "CustomEnv",
    "EnvManagerConfig",
    "ExperimentConfig",
    "Extra",
    "FieldDoc",
    "GeneratingArgs",
    "ModelArgs",
    "StrategyArgs",
    "TrainingArgs",
    "WorkerConfig",
    "__version__",
    "compose_config",
    "dump_resolved",
    "explain",
    "load_config",
    "load_yaml_dict",
    "missing_extras",
    "parse_app_args",
    "parse_device_list",
    "redact",
    "required_extras",
]
