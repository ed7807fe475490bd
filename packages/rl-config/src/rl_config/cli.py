"""``rl-config`` command line: ``check FILE [key=value ...]`` and ``explain KEY``."""

from __future__ import annotations

import argparse
import os
import sys

from rl_config.errors import ConfigError


def _check(args: argparse.Namespace) -> int:
    from rl_config.loading import load_config
    from rl_config.redact import redact, to_yaml

    try:
        cfg = load_config(args.file, args.overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    if not args.quiet:
        sys.stdout.write(to_yaml(redact(cfg.to_dict())))
    for line in cfg.config_warnings():
        print(f"warning: {line}", file=sys.stderr)
    print(f"ok: {args.file} is valid", file=sys.stderr)
    return 0


def _explain(args: argparse.Namespace) -> int:
    from rl_config.explain import explain

    try:
        doc = explain(args.key or "")
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(doc.render())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rl-config", description="Check experiment configs and explain their keys."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser(
        "check", help="compose, override, validate; print the resolved config or the errors"
    )
    check.add_argument("file", help="experiment YAML file")
    check.add_argument(
        "overrides", nargs="*", help="dotted overrides: a.b=1, +a.new=2, ++a.b=3, ~a.b"
    )
    check.add_argument("-q", "--quiet", action="store_true", help="print only errors/warnings")
    check.set_defaults(func=_check)
    explain = sub.add_parser("explain", help="print the documentation of a config key")
    explain.add_argument("key", nargs="?", help="dotted key, e.g. actor_train.training_args")
    explain.set_defaults(func=_explain)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rl-config`` script; returns the exit code (0 ok, 1 invalid)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # output piped into `head` and closed early
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
