"""``rl-config`` command line: ``check FILE [key=value ...]``, ``explain KEY`` and
``convert FILE --strategy fsdp2|deepspeed -o OUT``."""

from __future__ import annotations

import argparse
import os
import sys

from rl_config.errors import ConfigError
from rl_config.extras import missing_extras


def _check(args: argparse.Namespace) -> int:
    from rl_config.loading import load_app_config
    from rl_config.redact import redact, to_yaml

    try:
        cfg, section = load_app_config(args.file, args.overrides, section=args.app_section)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    if not args.quiet:
        sys.stdout.write(to_yaml(redact(cfg.to_dict())))
    for line in cfg.config_warnings():
        print(f"warning: {line}", file=sys.stderr)
    missing = missing_extras(cfg)
    for extra in missing:
        kind = "error" if extra.required and args.require_extras else "warning"
        print(f"{kind}: {extra.describe()}", file=sys.stderr)
    if args.require_extras and any(extra.required for extra in missing):
        print(
            f"{args.file} needs packages that are not installed here (see above)", file=sys.stderr
        )
        return 1
    if args.deep and _deep(cfg, args.app_section, section) != 0:
        return 1
    print(f"ok: {args.file} is valid" + (" and its preflight passes here" if args.deep else ""),
          file=sys.stderr)  # fmt: skip
    return 0


DEEP_CHECK_GROUP = "rl_config.deep_check"
"""Entry points of `check --deep`: `fn(cfg, section_name, section) -> (problems, notes)`
(rl-runtime's preflight: models, data files, devices, directories, packages on this host)."""


def _deep(cfg: object, section_name: str | None, section: object) -> int:
    """Run every `DEEP_CHECK_GROUP` entry point; 1 when one reports a problem (or none is
    installed)."""
    from importlib.metadata import entry_points

    found = list(entry_points(group=DEEP_CHECK_GROUP))
    if not found:
        print("error: --deep checks the config on this host with rl-runtime's preflight, which "
              "is not installed here (pip install rl-runtime)", file=sys.stderr)  # fmt: skip
        return 1
    failed = 0
    for entry in found:
        problems, notes = entry.load()(cfg, section_name, section)
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        failed |= bool(problems)
    return int(failed)


def _convert_verl(args: argparse.Namespace, overrides: list[str]) -> int:
    from pathlib import Path

    from rl_config.atomic_write import write_text_atomically
    from rl_config.loading import load_app_config
    from rl_config.verl_translate import MAIN_PPO, translate

    out = Path(args.output)
    if out.suffix != ".yaml":
        print(f"error: the output must end in .yaml (got {out.name})", file=sys.stderr)
        return 1
    file = None
    if args.config_name is not None and args.config_path is not None:
        name = args.config_name
        candidate = Path(args.config_path) / (name if name.endswith(".yaml") else f"{name}.yaml")
        file = candidate if candidate.is_file() else None
    entry = args.entry or MAIN_PPO
    try:
        translation = translate(
            overrides, entry=entry, config_file=file, config_name=args.config_name
        )
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(translation.table())
    try:
        translation.raise_if_refused()
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    command = " \\\n    ".join([f"python3 -m {entry}", *overrides])
    header = f"Translated from verl by `rl-config convert --from verl`:\n{command}\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(out, translation.to_yaml(header))
    section = "rlvr_app" if "rlvr_app" in translation.data else None
    flag = f" --app-section {section}" if section else ""
    try:
        load_app_config(out, [], section=section)
    except ConfigError as exc:
        print(f"wrote {out}, but it does not pass check:\n{exc}", file=sys.stderr)
        return 1
    print(f"ok: wrote {out}; check it with: rl-config check {out}{flag}", file=sys.stderr)
    return 0


def _convert(args: argparse.Namespace) -> int:
    from pathlib import Path

    if args.source == "verl":
        return _convert_verl(args, [a for a in [args.file, *args.overrides] if a])
    if args.file is None or args.strategy is None:
        print(
            "error: convert FILE --strategy fsdp2|deepspeed -o OUT (or --from verl)",
            file=sys.stderr,
        )
        return 1

    from rl_config.convert import convert_file, dump
    from rl_config.convert_opd import APP_SECTION
    from rl_config.loading import load_app_config, load_config

    out = Path(args.output)
    if out.suffix != ".yaml":
        print(f"error: the output must end in .yaml (got {out.name})", file=sys.stderr)
        return 1
    if out.resolve() == Path(args.file).resolve():
        print("error: the output would overwrite the input; choose another -o", file=sys.stderr)
        return 1
    try:
        conversion = convert_file(args.file, args.strategy)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dump(conversion, args.file, args.strategy))
    for note in conversion.notes:
        print(f"note: {note}", file=sys.stderr)
    try:
        if APP_SECTION in conversion.data:  # apps/distill's form: its section is no experiment key
            load_app_config(out, section=APP_SECTION)
        else:
            load_config(out)
    except ConfigError as exc:
        print(f"wrote {out}, but it does not pass check:\n{exc}", file=sys.stderr)
        return 1
    print(f"ok: wrote {out}; check it with: rl-config check {out}", file=sys.stderr)
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
    check.add_argument(
        "--app-section",
        metavar="NAME",
        help="an app's own top-level section to leave out (e.g. agentic_app: the app reads it)",
    )
    check.add_argument(
        "--require-extras",
        action="store_true",
        help="fail (exit 1) when an optional package the config needs is not installed here "
        "(default: a warning with the install command)",
    )
    check.add_argument(
        "--deep",
        action="store_true",
        help="also run the preflight on this host (needs rl-runtime): model and tokenizer "
        "resolvable, data files present and readable, devices, directories writable, packages",
    )
    check.set_defaults(func=_check)
    explain = sub.add_parser("explain", help="print the documentation of a config key")
    explain.add_argument("key", nargs="?", help="dotted key, e.g. actor_train.training_args")
    explain.set_defaults(func=_explain)
    convert = sub.add_parser(
        "convert",
        help="rewrite a Megatron config for FSDP2 or DeepSpeed (notes per changed key), or "
        "translate a verl command (--from verl KEY=VALUE ...)",
    )
    convert.add_argument(
        "file", nargs="?", help="experiment YAML file using megatron_train/megatron_infer"
    )
    convert.add_argument("overrides", nargs="*", help="--from verl: verl's KEY=VALUE overrides")
    convert.add_argument("--strategy", choices=["fsdp2", "deepspeed"])
    convert.add_argument("--from", dest="source", choices=["verl"], help="translate a verl command")
    convert.add_argument(
        "--entry", "-m", help="--from verl: verl's entry module (default verl.trainer.main_ppo)"
    )
    convert.add_argument(
        "--config-name",
        "--config_name",
        dest="config_name",
        help="--from verl: verl's Hydra config name",
    )
    convert.add_argument(
        "--config-path",
        "--config_path",
        dest="config_path",
        help="--from verl: verl's Hydra config folder",
    )
    convert.add_argument("-o", "--output", required=True, help="output YAML file")
    convert.set_defaults(func=_convert)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rl-config`` script; returns the exit code (0 ok, 1 invalid)."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    # overrides after an option (`check FILE -q seed=7`): argparse ends the positionals at `-q`
    if args.command in ("check", "convert") and not any(a.startswith("-") for a in unknown):
        args.overrides += unknown
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.func(args))
    except BrokenPipeError:  # output piped into `head` and closed early
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
