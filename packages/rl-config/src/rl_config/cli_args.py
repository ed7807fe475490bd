"""Command line of an app: ``--config FILE [key=value ...]`` or ROLL's launcher form.

ROLL's run scripts call ``python examples/start_<pipeline>.py --config_path DIR --config_name
NAME`` (Hydra: NAME without ``.yaml``, DIR relative to the script's folder ``examples/``). Apps
that parse their arguments with ``parse_app_args`` accept that line unchanged, so a ROLL run
script works with only the program name changed::

    args = parse_app_args(argv, flags={"dry-run": "print the plan and exit"})
    cfg = load_config(args.config, args.overrides)
    if "dry_run" in args.flags: ...
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rl_config.errors import ConfigError, ConfigIssue

ROLL_SCRIPT_DIRS = ("examples",)
"""Folders (under the working directory) where ROLL's start scripts, and so its relative
``--config_path``, live."""


@dataclass(frozen=True)
class AppArgs:
    """Parsed app arguments."""

    config: Path | None
    """The experiment YAML (None when neither form was given and there is no default)."""
    overrides: list[str]
    """Dotted ``key=value`` overrides, in order."""
    flags: frozenset[str]
    """Boolean options that were given, by their Python name (``dry_run``)."""
    verl: VerlArgs | None = None
    """``--verl``: ``overrides`` are a verl command's (``rl_config.verl_translate``)."""


@dataclass(frozen=True)
class VerlArgs:
    """A verl command: its entry module (``-m``), and its Hydra config (``--verl-config FILE``, or
    verl's ``--config-path DIR --config-name NAME``)."""

    entry: str
    config_file: Path | None = None
    config_name: str | None = None


def resolve_roll_config(config_path: str, config_name: str, cwd: Path | None = None) -> Path:
    """The file Hydra would load for ``--config_path DIR --config_name NAME``.

    DIR is tried as given (absolute or relative to ``cwd``), then under ``cwd/examples`` (ROLL's
    scripts pass DIR relative to their own folder). NAME may carry ``.yaml`` or not."""
    base = Path(cwd or Path.cwd())
    name = config_name if config_name.endswith(".yaml") else f"{config_name}.yaml"
    folder = Path(config_path).expanduser()
    candidates = [folder] if folder.is_absolute() else [base / folder]
    if not folder.is_absolute():
        candidates += [base / d / folder for d in ROLL_SCRIPT_DIRS]
    for candidate in candidates:
        if (candidate / name).is_file():
            return (candidate / name).resolve()
    searched = ", ".join(str(c / name) for c in candidates)
    raise ConfigError(
        ConfigIssue(
            "",
            f"--config_path {config_path} --config_name {config_name}: no such file "
            f"(searched {searched})",
        )
    )


def build_app_parser(
    prog: str, flags: Mapping[str, str], default_config: Path | None, description: str = ""
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", type=Path, default=None, help=f"experiment YAML (default: {default_config})"
    )
    parser.add_argument(
        "--config_path",
        "--config-path",
        dest="config_path",
        help="ROLL/Hydra form: folder of the config (relative paths also tried under examples/)",
    )
    parser.add_argument(
        "--config_name",
        "--config-name",
        dest="config_name",
        help="ROLL/Hydra form: config file name without .yaml",
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides: a.b=1, +a.new=2, ~a.b")
    parser.add_argument(
        "--verl",
        action="store_true",
        help="the overrides (and --config-path/--config-name) are a verl command's: translated "
        "with verl's meaning (the table is printed first)",
    )
    parser.add_argument(
        "--verl-config", type=Path, default=None, help="a verl (Hydra) config file (implies --verl)"
    )
    parser.add_argument(
        "-m",
        "--entry",
        default=None,
        help="with --verl: verl's entry module as `python -m` runs it (default: the app's)",
    )
    for flag, text in flags.items():
        parser.add_argument(f"--{flag}", action="store_true", help=text)
    return parser


def parse_app_args(
    argv: Sequence[str] | None = None,
    *,
    flags: Mapping[str, str] | None = None,
    default_config: Path | None = None,
    prog: str = "app",
    cwd: Path | None = None,
    description: str = "",
    verl_entry: str = "verl.trainer.main_ppo",
) -> AppArgs:
    """Parse ``--config FILE key=value ... --FLAG`` or ``--config_path DIR --config_name NAME``.

    ``flags`` maps option names (``dry-run``) to help texts; ``description`` is what ``--help``
    says the app does (its module docstring). Raises ``ConfigError`` when both
    forms are mixed, when only half of the ROLL form is given, or when its file does not exist;
    argparse exits on unknown options."""
    options = dict(flags or {"dry-run": "print the plan and exit"})
    args = build_app_parser(prog, options, default_config, description).parse_intermixed_args(
        None if argv is None else list(argv)
    )
    given = frozenset(
        name.replace("-", "_") for name in options if getattr(args, name.replace("-", "_"))
    )
    if args.verl or args.verl_config is not None:
        return _verl_args(args, given, verl_entry, cwd)
    if args.entry is not None:
        raise ConfigError(ConfigIssue("--entry", "only with --verl (a verl entry module)"))
    roll = (args.config_path, args.config_name)
    if any(roll) and args.config is not None:
        raise ConfigError(
            ConfigIssue("", "give either --config FILE or --config_path DIR --config_name NAME")
        )
    if any(roll) and not all(roll):
        missing = "--config_name" if args.config_name is None else "--config_path"
        raise ConfigError(ConfigIssue("", f"the ROLL form needs {missing} too"))
    if all(roll):
        config: Path | None = resolve_roll_config(args.config_path, args.config_name, cwd)
    else:
        config = args.config if args.config is not None else default_config
    return AppArgs(config=config, overrides=list(args.overrides), flags=given)


def _verl_args(
    args: argparse.Namespace, flags: frozenset[str], entry: str, cwd: Path | None
) -> AppArgs:
    """``--verl``: verl's ``--config-path DIR --config-name NAME`` name a verl config (a file
    there, else one of verl's own names); ``--config`` is refused (the translation is the config)."""
    if args.config is not None:
        raise ConfigError(
            ConfigIssue("--config", "not with --verl (the verl command is the config)")
        )
    file = args.verl_config
    name = args.config_name
    if name is not None and file is None:
        base = Path(cwd or Path.cwd()) / (args.config_path or ".")
        candidate = base / (name if name.endswith(".yaml") else f"{name}.yaml")
        if args.config_path is not None and candidate.is_file():
            file = candidate
    verl = VerlArgs(entry=args.entry or entry, config_file=file, config_name=name)
    return AppArgs(config=None, overrides=list(args.overrides), flags=flags, verl=verl)
