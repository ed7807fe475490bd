"""Dotted command-line overrides: ``a.b=1``, ``+a.new=2``, ``++a.b=3``, ``~a.b``.

The grammar of values (numbers, ``null``, quoted strings, ``[lists]``, ``{maps}``) is Hydra's
override grammar; the application is ours, with these semantics:

* ``a.b=v`` sets the key, creating it if absent (the schema then rejects keys it does not know,
  with a suggestion), so schema keys that a YAML file leaves at their defaults can be set too;
* ``+a.b=v`` adds a key and fails if it already exists; ``++a.b=v`` adds or replaces;
* ``~a.b`` deletes the key (``~a.b=v`` only if its value is ``v``).

``device_mapping=list(range(0,4))`` is accepted unquoted (kept as text for the safe parser).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rl_config.errors import ConfigError, ConfigIssue

if TYPE_CHECKING:
    from omegaconf import DictConfig

_DEVICE_TEXT = re.compile(r"^\s*(list\s*\(|range\s*\()[\w\s(),+\[\]-]*$")
_KEY = re.compile(r"^[A-Za-z_][\w-]*(\.[A-Za-z_0-9][\w-]*)*$")


@dataclass(frozen=True)
class Override:
    """One parsed override."""

    kind: Literal["set", "add", "force_add", "delete"]
    key: str
    value: Any = None
    has_value: bool = True
    text: str = ""


def parse_override(text: str) -> Override:
    """Parse one ``key=value`` style override (raises ConfigError naming it)."""
    raw = text.strip()
    kind: Literal["set", "add", "force_add", "delete"] = "set"
    body = raw
    if body.startswith("++"):
        kind, body = "force_add", body[2:]
    elif body.startswith("+"):
        kind, body = "add", body[1:]
    elif body.startswith("~"):
        kind, body = "delete", body[1:]
    key, sep, value_text = body.partition("=")
    key = key.strip()
    if not _KEY.match(key):
        raise ConfigError(
            ConfigIssue("", f"override {text!r}: expected key=value (key a dotted path like a.b.c)")
        )
    if not sep:
        if kind == "delete":
            return Override("delete", key, None, False, raw)
        raise ConfigError(ConfigIssue(key, f"override {text!r} has no '=value'"))
    if _DEVICE_TEXT.match(value_text):
        return Override(kind, key, value_text.strip(), True, raw)
    return Override(kind, key, _parse_value(key, value_text, text), True, raw)


def _parse_value(key: str, value_text: str, text: str) -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    try:
        parsed = parser.parse_override(f"k={value_text}")
    except HydraException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            ConfigIssue(key, f"cannot parse the value of override {text!r}: {first}")
        ) from None
    if parsed.is_sweep_override():
        raise ConfigError(
            ConfigIssue(
                key,
                f"override {text!r} looks like a sweep (a,b); write a list as [a,b] or quote it",
            )
        )
    return parsed.value()


def apply_overrides(cfg: DictConfig, overrides: list[Override]) -> set[str]:
    """Apply overrides in order to an unresolved config; returns the top-level keys they touch.

    ``hydra.*`` overrides are ignored (the ``hydra`` section is not part of an experiment).
    """
    from omegaconf import DictConfig, OmegaConf

    touched: set[str] = set()
    OmegaConf.set_struct(cfg, False)
    for ov in overrides:
        if ov.key == "hydra" or ov.key.startswith("hydra."):
            continue
        parent_key, _, leaf = ov.key.rpartition(".")
        exists = (
            OmegaConf.select(
                cfg,
                ov.key,
                default=_MISSING,
                throw_on_missing=False,
                throw_on_resolution_failure=False,
            )
            is not _MISSING
        )
        if ov.kind == "delete":
            if not exists:
                raise ConfigError(
                    ConfigIssue(ov.key, f"override {ov.text!r}: no such key to delete")
                )
            parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
            if ov.has_value:
                current = OmegaConf.select(cfg, ov.key)
                if current != ov.value:
                    raise ConfigError(
                        ConfigIssue(
                            ov.key,
                            f"override {ov.text!r}: value is {current!r}, not {ov.value!r}",
                        )
                    )
            if isinstance(parent, DictConfig):
                del parent[leaf]
            touched.add(ov.key.split(".")[0])
            continue
        if ov.kind == "add" and exists:
            raise ConfigError(
                ConfigIssue(
                    ov.key,
                    f"override {ov.text!r}: the key already exists; use {ov.key}=... to change "
                    f"it or ++{ov.key}=... to replace it",
                )
            )
        try:
            OmegaConf.update(cfg, ov.key, ov.value, merge=False, force_add=True)
        except Exception as exc:  # omegaconf raises several types for a bad path
            raise ConfigError(ConfigIssue(ov.key, f"override {ov.text!r} failed: {exc}")) from None
        touched.add(ov.key.split(".")[0])
    return touched


class _Missing:
    pass


_MISSING = _Missing()
