"""YAML loading: Hydra defaults lists, ``${...}`` interpolation, dotted overrides.

Composition uses Hydra's compose API, so defaults lists behave as in Hydra 1.3 (and ROLL):
entries are merged in order (later ones win), the file's own keys are merged at ``_self_``
(last when ``_self_`` is not listed), ``@_here_`` merges at the top, relative paths such as
``../config/traj_envs`` are looked up next to the file first, then in the config library
bundled with rl-config (``rl_config/library``); an entry may not reach outside the config's
tree, ROLL's ``../config/`` beside it and the library (rl_config.defaults_scope). The
``hydra:`` section is ignored.

Top-level keys that are not schema fields are *variables*: they exist to be interpolated
(``${max_actions_per_traj}``, ``${custom_env.SimpleSokoban}``, ``${deepspeed_zero3}``). A key is
a variable if it comes from a defaults entry (not from the file itself or an override) or if
some ``${...}`` refers to it. Variables are dropped after interpolation; any other unknown key
is left in and rejected by the schema with a suggestion. An app's own section (``rlvr_app:``,
``load_app_config``'s ``section``) is no variable, wherever it comes from.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_config.errors import ConfigError, ConfigIssue
from rl_config.overrides import apply_overrides, parse_override

if TYPE_CHECKING:
    from omegaconf import DictConfig

LIBRARY_DIR = Path(__file__).resolve().parent / "library"
"""Bundled config library: ``config/`` (env and DeepSpeed fragments), ``examples/``."""

_HYDRA_LOCK = threading.Lock()
_REF = re.compile(r"\$\{\s*([A-Za-z_][\w-]*)")
_ENV_NO_DEFAULT = re.compile(r"\$\{oc\.env:\s*([A-Za-z_]\w*)\s*\}")


@dataclass
class ComposedConfig:
    """A composed, interpolated config before schema validation."""

    data: dict[str, Any]
    """Resolved mapping without the variables (what the schema validates)."""
    variables: dict[str, Any] = field(default_factory=dict)
    """Top-level variables that were dropped (resolved values)."""
    source: str | None = None
    notes: list[ConfigIssue] = field(default_factory=list)
    """Warnings of the loading itself (e.g. an unset environment variable read as null)."""
    unresolved: dict[str, Any] = field(default_factory=dict)
    """The composed mapping after the overrides, before interpolation (``${...}`` kept, the
    variables in): what rl_config.convert rewrites, without composing the file again."""


def library_search_path() -> list[Path]:
    """Directories searched after the file's own directory for defaults entries."""
    return [LIBRARY_DIR / "examples", LIBRARY_DIR]


@contextmanager
def _hydra_for(config_file: Path) -> Iterator[None]:
    """Hydra initialised at ``config_file``'s directory, reading ``file://`` configs through
    ``_bounded_file_source`` (every file the defaults list brings in is checked, not only the
    one named on the command line: its place, rl_config.defaults_scope, and its size)."""
    from hydra import initialize_config_dir
    from hydra._internal.sources_registry import SourcesRegistry
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.plugins import Plugins
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    with _HYDRA_LOCK:
        outer = get_gh_backup()
        GlobalHydra.instance().clear()
        Plugins.instance()  # registers Hydra's own sources first (it refuses a second "file")
        sources = SourcesRegistry.instance().types
        plain = sources.get("file")
        sources["file"] = _bounded_file_source(config_file)
        try:
            with initialize_config_dir(config_dir=str(config_file.parent), version_base="1.3"):
                yield
        finally:
            if plain is not None:
                sources["file"] = plain
            restore_gh_from_backup(outer)


def _bounded_file_source(config_file: Path) -> type:
    """Hydra's file config source for ``config_file``'s composition, checking each file before
    loading it: inside the directories its defaults list may reach
    (rl_config.defaults_scope), and within rl_config.yaml_bounds (size, alias expansion)."""
    from hydra._internal.core_plugins.file_config_source import FileConfigSource

    from rl_config.defaults_scope import check_defaults_file, defaults_roots
    from rl_config.yaml_bounds import check_yaml_file

    roots = defaults_roots(config_file, LIBRARY_DIR)

    class BoundedFileConfigSource(FileConfigSource):
        def load_config(self, config_path: str) -> Any:
            file = Path(self.path) / self._normalize_file_name(config_path)
            if file.is_file():
                check_defaults_file(file, config_path, roots, str(config_file))
                check_yaml_file(file.resolve())
            return super().load_config(config_path)

    return BoundedFileConfigSource


def _compose(path: Path) -> DictConfig:
    from hydra import compose
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    search = ",".join(f"file://{p}" for p in library_search_path())
    with _hydra_for(path), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*_self_.*")
        warnings.filterwarnings("ignore", category=UserWarning, module="hydra")
        try:
            cfg = compose(config_name=path.stem, overrides=[f"hydra.searchpath=[{search}]"])
        except MissingConfigException as exc:
            missing = getattr(exc, "missing_cfg_file", None) or ""
            searched = [str(path.parent), *(str(p) for p in library_search_path())]
            raise ConfigError(
                ConfigIssue(
                    "defaults",
                    f"{_first_line(exc)} (entry {missing!r}; searched {', '.join(searched)})",
                ),
                source=str(path),
            ) from None
        except (HydraException, OmegaConfBaseException) as exc:
            raise ConfigError(ConfigIssue("", _first_line(exc)), source=str(path)) from None
        except RecursionError:  # Hydra follows a defaults list that leads back to itself
            raise ConfigError(
                ConfigIssue(
                    "defaults",
                    "the defaults lists form a cycle (a file that includes itself, directly or "
                    "through other files): remove the entry that leads back",
                ),
                source=str(path),
            ) from None
    return cfg


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _own_keys(path: Path) -> set[str]:
    """The file's own top-level keys (not ``defaults``/``hydra``); a verl (Hydra) config is
    refused here, before its defaults list is composed (rl_config.verl_keys)."""
    from omegaconf import DictConfig, OmegaConf

    from rl_config.verl_keys import is_verl_file, verl_file_issue
    from rl_config.yaml_bounds import check_yaml_file

    check_yaml_file(path)
    try:
        raw = OmegaConf.load(path)
    except Exception as exc:  # yaml and omegaconf errors
        raise ConfigError(ConfigIssue("", f"cannot parse YAML: {exc}"), source=str(path)) from None
    if not isinstance(raw, DictConfig):
        raise ConfigError(ConfigIssue("", "the file must hold a mapping at the top"), str(path))
    keys = {str(k) for k in raw}
    if is_verl_file(keys):
        raise ConfigError(verl_file_issue(str(path), keys), source=str(path))
    return keys - {"defaults", "hydra"}


def _referenced_roots(node: Any) -> set[str]:
    """Top-level names that ``${name...}`` interpolations refer to, anywhere in ``node``."""
    found: set[str] = set()
    if isinstance(node, dict):
        for value in node.values():
            found |= _referenced_roots(value)
    elif isinstance(node, list):
        for value in node:
            found |= _referenced_roots(value)
    elif isinstance(node, str):
        found.update(m.group(1) for m in _REF.finditer(node) if ":" not in m.group(0))
    return found


def _leaf_strings(node: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(dotted path, text) of every string leaf of a plain container."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaf_strings(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _leaf_strings(value, f"{prefix}[{i}]")
    elif isinstance(node, str):
        yield prefix, node


def _unset_env_to_null(cfg: DictConfig, unresolved: Any) -> list[ConfigIssue]:
    """``${oc.env:NAME}`` without a default, NAME unset: read as null, with a warning.

    Checking a config must not depend on the secrets of the shell it runs in (ROLL's examples
    read ``${oc.env:WANDB_API_KEY}``); the consumer of the value fails if it needs one."""
    import os

    from omegaconf import OmegaConf

    notes: list[ConfigIssue] = []
    for path, text in _leaf_strings(unresolved):
        names = [n for n in _ENV_NO_DEFAULT.findall(text) if n not in os.environ]
        if not names or "[" in path:
            continue
        patched = _ENV_NO_DEFAULT.sub(
            lambda m, unset=names: (
                f"${{oc.env:{m.group(1)},null}}" if m.group(1) in unset else m.group(0)
            ),
            text,
        )
        OmegaConf.update(cfg, path, patched, merge=False)
        unset = ", ".join(names)
        notes.append(
            ConfigIssue(path, f"environment variable {unset} is not set; the value is null")
        )
    return notes


def _schema_keys() -> set[str]:
    from rl_config.schema import ExperimentConfig
    from rl_config.schema_walk import yaml_fields

    return set(yaml_fields(ExperimentConfig)) | set(ExperimentConfig.model_fields)


def _resolve(cfg: DictConfig, source: str | None) -> dict[str, Any]:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or ""
        msg = (getattr(exc, "msg", None) or _first_line(exc)).strip().splitlines()[0]
        missing = _MISSING_KEY.search(msg)
        hint = _library_fragment_hint(missing.group(1)) if missing else ""
        raise ConfigError(
            ConfigIssue(str(key), f"interpolation failed: {msg}{hint}"), source
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(ConfigIssue("", "the config must be a mapping"), source)
    return {str(k): v for k, v in data.items()}


_MISSING_KEY = re.compile(r"Interpolation key '([A-Za-z_][\w-]*)[.']")


def _library_fragment_hint(name: str) -> str:
    """For ``${name}`` that no file defines but a bundled library fragment does (e.g.
    ``deepspeed_zero2``): how to bring it in ('' when no fragment defines ``name``)."""
    from omegaconf import DictConfig, OmegaConf

    for folder in library_search_path():
        for file in sorted((folder / "config").glob("*.yaml")):
            raw = OmegaConf.load(file)
            if isinstance(raw, DictConfig) and name in raw:
                return (
                    f"; {name} is defined in rl-config's library file config/{file.name}: add "
                    f"it to the config's defaults list (defaults: [../config/{file.stem}@_here_]), "
                    "as ROLL's examples do"
                )
    return ""


def _directory_message(path: str | Path, folder: Path) -> str:
    """What to say when a directory is given where one config file is expected."""
    names = sorted(p.name for p in folder.glob("*.yaml"))
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    inside = f"its YAML files: {shown}" if names else "it holds no .yaml file"
    return (
        f"{path} is a directory; a config is one YAML file ({inside}). The apps also take "
        "ROLL's form: --config_path DIR --config_name NAME"
    )


def compose_config(
    path: str | Path,
    overrides: Iterable[str] = (),
    *,
    keep_variables: bool = False,
    app_section: str | None = None,
) -> ComposedConfig:
    """Compose ``path`` with its defaults, apply ``overrides``, interpolate, split off variables.
    ``app_section`` (an app's own options, e.g. ``rlvr_app``) is never a variable: a config
    whose defaults list holds an app's config keeps that app's options."""
    file = Path(path).expanduser().resolve()
    if file.is_dir():
        raise ConfigError(ConfigIssue("", _directory_message(path, file)))
    if not file.is_file():
        raise ConfigError(ConfigIssue("", f"no such file: {path}"))
    if file.suffix != ".yaml":
        raise ConfigError(
            ConfigIssue("", f"config files must end in .yaml (got {file.name})"), str(file)
        )
    from omegaconf import OmegaConf

    parsed = [parse_override(o) for o in overrides]
    own = _own_keys(file)
    cfg = _compose(file)
    try:
        touched = apply_overrides(cfg, parsed)
    except ConfigError as exc:
        raise exc.with_source(str(file)) from None
    unresolved = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(unresolved, dict)
    unresolved = {str(k): v for k, v in unresolved.items()}
    referenced = _referenced_roots(unresolved)
    notes = _unset_env_to_null(cfg, unresolved)
    data = _resolve(cfg, str(file))
    if keep_variables:
        return ComposedConfig(data, {}, str(file), notes, unresolved)
    schema = _schema_keys()
    variables: dict[str, Any] = {}
    for key in list(data):
        if key in schema or key == app_section:
            continue
        from_defaults = key not in own and key not in touched
        if from_defaults or key in referenced:
            variables[key] = data.pop(key)
    return ComposedConfig(data, variables, str(file), notes, unresolved)


def load_yaml_dict(path: str | Path, overrides: Iterable[str] = ()) -> dict[str, Any]:
    """The composed, interpolated mapping of ``path`` that the schema validates.

    ``ExperimentConfig.model_validate(load_yaml_dict(p, o))`` equals ``load_config(p, o)``.
    Raises ``ConfigError`` for missing defaults, bad overrides or failed interpolation.
    """
    return compose_config(path, overrides).data


def load_config(path: str | Path, overrides: Iterable[str] = ()):  # -> ExperimentConfig
    """Load, compose, override, interpolate and validate an experiment config.

    Raises ``ConfigError`` listing every problem, attributed to the file.
    """
    return load_app_config(path, overrides, section=None)[0]


def _from_command_line(issues: list[ConfigIssue], overrides: list[str]) -> list[ConfigIssue]:
    """`issues`, each about a key a command-line override set (the key, a key under it, or the
    section holding it) saying so, so that an error is not looked for in the file. Of several
    overrides of the key, the last one names it: it set the value."""
    keys = [(parse_override(text).key, text.strip()) for text in reversed(overrides)]
    out = []
    for issue in issues:
        path = issue.path
        hit = next(
            (text for key, text in keys
             if path and (path == key or path.startswith(key + ".") or key.startswith(path + "."))),
            None,
        )  # fmt: skip
        out.append(dataclasses.replace(issue, origin=f"command line: {hit}") if hit else issue)
    return out


def load_app_config(path: str | Path, overrides: Iterable[str] = (), *, section: str | None):
    """:func:`load_config` for an app whose YAML also holds its own options under ``section``
    (e.g. ``agentic_app:``), which are not experiment keys: returns ``(config, section or None)``.
    """
    from rl_config.roll_keys import pipeline_or_megatron_issue
    from rl_config.schema import ExperimentConfig

    overrides = list(overrides)
    composed = compose_config(path, overrides, app_section=section)
    source = composed.source or str(path)
    data = dict(composed.data)
    app_options = data.pop(section, None) if section else None
    from rl_config.output_paths import rebase_under_output_dir

    rebased = rebase_under_output_dir(data, overrides)
    issue = pipeline_or_megatron_issue(data, source=str(path))
    if issue is not None:
        raise ConfigError(issue, source=source)
    try:
        cfg = ExperimentConfig.model_validate(data)
    except ConfigError as exc:
        raise ConfigError(_from_command_line(exc.issues, overrides), source=source) from None
    cfg._roll_notes[:0] = [*rebased, *composed.notes]
    return cfg, app_options
