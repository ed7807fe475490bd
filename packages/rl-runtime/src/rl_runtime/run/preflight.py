"""Preflight: what a run needs from this host, checked before Ray or any worker starts.

One implementation shared by an app's `--dry-run`, its real run (rl_runtime.cli.app_main, before
anything is built, moved or started) and `rl-preflight` (the deep check of a config file):

* models: the policy model (`pretrain`, or the tiny model the app builds: rl_runtime.run.model_source)
  and every role's own `model_args.model_name_or_path`, each resolvable to a local directory
  with a tokenizer, and each role's model config override (`model_args.model_config_kwargs`)
  naming attributes its model's config has;
* data: every data file the app reads is present and its first rows parse (`DataFiles`), and
  the replay engine's recorded generations are there (`engine_input_issues`);
* devices: a device kind asked for (`RL_DEVICE` in the environment or in `system_envs`) is
  present on this host, and an embedded Ray cluster holds the devices and CPUs the placement
  reserves;
* directories: output_dir, the checkpoint and the log directory can be written (the nearest
  existing parent, when they do not exist yet: nothing is created here);
* packages: the optional packages the config needs are installed (rl_config.extras; a dry run
  notes them, a run stops).

Every problem is one `ConfigIssue` naming the key; nothing is created, moved or started.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_config.errors import ConfigError, ConfigIssue

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
"""One of these in a model directory: its tokenizer loads from there."""

FIRST_ROWS = 8
"""Rows of each data file parsed by the preflight."""


@dataclass(frozen=True)
class DataFiles:
    """Data files an app reads, named by their config key. `check_rows(path)`: the problem
    with the file's first rows (None: they parse); None checks presence only."""

    key: str
    files: tuple[str, ...]
    check_rows: Callable[[str], str | None] | None = None


@dataclass
class PreflightReport:
    """The problems (one per key) and notes (printed, not errors) of a preflight."""

    problems: list[ConfigIssue]
    notes: list[str]

    def raise_if_problems(self) -> None:
        if self.problems:
            raise ConfigError(self.problems)


def preflight(
    cfg: Any,
    components: Any,
    *,
    app: Any = None,
    data: Sequence[DataFiles] = (),
    use_ray: bool = True,
    num_cpus: float | None = None,
    cpu_per_bundle: float = 1.0,
    packages_required: bool = True,
) -> PreflightReport:
    """Every check of the module docstring, for the validated config `cfg`, its `components`
    (rl_runtime.compose) and the app's options `app` (its `build_tiny_model`, None: no app).
    `packages_required=False` (a dry run, which may plan on another host than the run's): a
    missing optional package is a note, not a problem."""
    problems: list[ConfigIssue] = []
    notes: list[str] = []
    system_envs = dict(getattr(cfg, "system_envs", None) or {})
    m_problems, m_notes = model_issues(cfg, components, app, system_envs)
    problems += m_problems
    notes += m_notes
    problems += data_issues(data)
    problems += engine_input_issues(cfg)
    devices = device_issues(system_envs)
    problems += devices
    if not devices and use_ray:
        problems += placement_issues(components, num_cpus, cpu_per_bundle)
    problems += writable_issues(components)
    packages = package_issues(cfg)
    if packages_required:
        problems += packages
    else:  # a dry run on another host than the run's: said, not refused
        notes += [f"{issue} (a run stops here)" for issue in packages]
    return PreflightReport(problems, notes)


def model_issues(
    cfg: Any, components: Any, app: Any, system_envs: Mapping[str, Any]
) -> tuple[list[ConfigIssue], list[str]]:
    """The policy model and each role's own model resolvable, with a tokenizer."""
    from rl_rollout.tiny_model import TINY_MODEL_MARKER
    from rl_runtime.run.model_source import (
        resolve_model,
        tiny_model_to_build,
        unused_tiny_model_note,
    )

    problems: list[ConfigIssue] = []
    notes: list[str] = []
    pretrain = getattr(cfg, "pretrain", None)
    build_at = getattr(app, "build_tiny_model", None) if app is not None else None
    key = f"{app.SECTION}.build_tiny_model" if app is not None else "build_tiny_model"
    checked: dict[str, str | None] = {}  # name -> resolved dir (None: built by the app)
    if pretrain is not None:
        try:
            if tiny_model_to_build(pretrain, build_at, key):
                checked[pretrain] = None
                built = (Path(pretrain).expanduser() / TINY_MODEL_MARKER).is_file()
                what = (
                    "the tiny model built there earlier is used"
                    if built
                    else "a tiny model is built there"
                )
                notes.append(f"pretrain {pretrain}: {what} ({key})")
            else:
                checked[pretrain] = resolve_model(pretrain, system_envs=system_envs)
                note = unused_tiny_model_note(pretrain, build_at, key)
                if note:
                    notes.append(note)
        except ConfigError as exc:
            problems += exc.issues
            checked[pretrain] = None
    from rl_runtime.cli.app_options import AppRunOptions

    made = app.built_models() if isinstance(app, AppRunOptions) else ()
    built = {Path(d).expanduser().resolve() for d in made}
    for role in components.roles:
        name = role.model_path
        if name is None or name in checked:
            continue
        if Path(name).expanduser().resolve() in built:
            checked[name] = None
            notes.append(f"{role.model_key} {name}: built by the app before the run")
            continue
        role_key = role.model_key
        try:
            checked[name] = resolve_model(name, key=role_key, system_envs=system_envs)
        except ConfigError as exc:
            problems += exc.issues
            checked[name] = None
    for name, path in checked.items():
        if path is not None and not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
            problems.append(
                ConfigIssue(
                    "pretrain" if name == pretrain else "model_name_or_path",
                    f"{name} ({path}) has no tokenizer files ({', '.join(TOKENIZER_FILES)}): "
                    "save the tokenizer with the model (tokenizer.save_pretrained)",
                )
            )
    problems += model_config_issues(components, {n: p for n, p in checked.items() if p}, pretrain)
    return problems, notes


def model_config_issues(
    components: Any, resolved: Mapping[str, str], pretrain: str | None
) -> list[ConfigIssue]:
    """Each role's model config override (`<role>.model_args.model_config_kwargs`) checked on its
    model's config when that is a local directory here (the loaders check it again)."""
    from transformers import AutoConfig

    from rl_config.model_config import check_model_config_overrides

    problems: list[ConfigIssue] = []
    for role in components.roles:
        path = resolved.get(role.model_path or pretrain or "")
        if not role.config_overrides or path is None or not (Path(path) / "config.json").is_file():
            continue
        key = f"{role.role}.model_args.model_config_kwargs"
        try:
            config = AutoConfig.from_pretrained(path, trust_remote_code=False)
            check_model_config_overrides(config, role.config_overrides, key)
        except ValueError as exc:
            problems.append(ConfigIssue(key, str(exc)))
    return problems


def engine_input_issues(cfg: Any) -> list[ConfigIssue]:
    """What an inference engine reads when it starts: the replay engine's recorded generations
    (rl_rollout.replay_engine), present and holding recorded calls."""
    from rl_rollout.replay_engine import generations_problem

    infer = getattr(cfg, "actor_infer", None)
    strategy = getattr(infer, "strategy_args", None)
    if strategy is None or strategy.strategy_name != "replay":
        return []
    key = "actor_infer.strategy_args.strategy_config.generations"
    directory = (strategy.strategy_config or {}).get("generations")
    problem = generations_problem(directory) if isinstance(directory, str) else None
    return [] if problem is None else [ConfigIssue(key, problem)]


def data_issues(data: Sequence[DataFiles]) -> list[ConfigIssue]:
    """Each data file present and its first rows parsed."""
    problems: list[ConfigIssue] = []
    for entry in data:
        missing = [f for f in entry.files if not os.path.exists(f)]
        if missing:
            problems.append(
                ConfigIssue(
                    entry.key,
                    f"dataset file not found: {', '.join(missing)} (working directory "
                    f"{os.getcwd()})",
                )
            )
            continue
        if entry.check_rows is None:
            continue
        for path in entry.files:
            why = entry.check_rows(path)
            if why is not None:
                problems.append(ConfigIssue(entry.key, f"{path}: {why}"))
    return problems


def check_devices(cfg: Any) -> None:
    """`device_issues` of the config's `system_envs` and the environment as a `ConfigError`."""
    problems = device_issues(dict(getattr(cfg, "system_envs", None) or {}))
    if problems:
        raise ConfigError(problems)


def device_issues(system_envs: Mapping[str, Any]) -> list[ConfigIssue]:
    """The device kind asked for (`RL_DEVICE`, the stack's device setting: in `system_envs`
    for the workers, in the environment for this process) is a known kind present here."""
    from rl_sync.device import DEVICE_ENV_VAR, DEVICE_KINDS, is_available

    asked = [(f"system_envs.{DEVICE_ENV_VAR}", system_envs.get(DEVICE_ENV_VAR)),
             (f"{DEVICE_ENV_VAR} (environment)", os.environ.get(DEVICE_ENV_VAR))]  # fmt: skip
    problems: list[ConfigIssue] = []
    for key, value in asked:
        if value is None or not str(value).strip():
            continue
        kind = str(value).strip().lower()
        if kind not in DEVICE_KINDS:
            problems.append(
                ConfigIssue(key, f"{value!r} is not a device kind; one of {list(DEVICE_KINDS)}")
            )
        elif not is_available(kind):
            present = [k for k in DEVICE_KINDS if k != "cpu" and is_available(k)] or ["cpu only"]
            extra = " (torch_npu is not importable)" if kind == "npu" else ""
            problems.append(
                ConfigIssue(
                    key,
                    f"asks for {kind} devices, but this host has none{extra}; it has: "
                    f"{', '.join(present)}. Run on a host with {kind} devices, or set it to a "
                    "kind present here (or remove it: the kind is then detected)",
                )
            )
    return problems


def placement_issues(
    components: Any, num_cpus: float | None, cpu_per_bundle: float
) -> list[ConfigIssue]:
    """An embedded Ray cluster (no RAY_ADDRESS) holds what the placement reserves: the devices
    this host has and `num_cpus` CPUs (else this host's CPUs)."""
    from rl_runtime.cluster.cluster import embedded_fit_error
    from rl_runtime.cluster.ray_setup import RayOptions, joined_address
    from rl_runtime.run.plan import placement_plan
    from rl_sync.device import detect_device_kind, device_count

    if joined_address(RayOptions()):
        return []
    try:
        plan = placement_plan(components, cpu_per_bundle)
    except ConfigError as exc:
        return list(exc.issues)
    except (ValueError, RuntimeError) as exc:
        return [ConfigIssue("placement", str(exc))]
    available: dict[str, float] = {"CPU": float(num_cpus or os.cpu_count() or 1)}
    if plan.resource_name:
        kind = detect_device_kind()
        available[plan.resource_name] = float(device_count(kind))
    error = embedded_fit_error(plan, {**plan.resource_totals(), **available})
    return list(error.issues) if isinstance(error, ConfigError) else []


def _writable(path: Path) -> Path | None:
    """The nearest existing directory of `path` (itself or a parent) when it cannot be written
    there, else None."""
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.is_dir() and os.access(probe, os.W_OK | os.X_OK):
        return None
    return probe


def writable_issues(components: Any) -> list[ConfigIssue]:
    """output_dir, the checkpoint directory and the log directory can be written."""
    dirs = [("output_dir", components.output_dir)]
    checkpoint = getattr(components, "checkpoint", None)
    if checkpoint is not None:
        dirs.append(("checkpoint_config.output_dir", checkpoint.directory))
    tracker = getattr(components, "tracker", None)
    if tracker is not None:
        dirs.append(("logging_dir", tracker.log_dir))
    problems = []
    for key, directory in dirs:
        blocked = _writable(Path(directory))
        if blocked is not None:
            what = "is not a directory" if blocked.exists() and not blocked.is_dir() else (
                "cannot be written by this user"
            )  # fmt: skip
            problems.append(
                ConfigIssue(key, f"{directory}: {blocked} {what}; choose a directory you can write")
            )
    return problems


def package_issues(cfg: Any) -> list[ConfigIssue]:
    """The optional packages the config needs, installed (rl_config.extras)."""
    from rl_config.extras import missing_extras

    return [ConfigIssue(e.key, e.describe()) for e in missing_extras(cfg) if e.required]
